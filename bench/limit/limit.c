/*
 * limit: the bench's lower bound on the cost of answering a DNS query over
 * UDP. One thread, one socket, blocking recvmmsg/sendmmsg in batches, and a
 * canned answer: the query's ID and question are copied, QR (and RA) set,
 * and one A record (a compression pointer to the question name, TTL 30,
 * 192.0.2.1) appended. No cache, no parsing beyond walking the question
 * name, no EDNS in the answer. Whatever a real server does on top of this
 * is its own cost: bench/run.sh reports each server's CPU per query against
 * this one's.
 *
 * Usage: limit ADDR PORT   (e.g. limit 127.0.0.1 5306)
 * Runs until SIGTERM/SIGINT. Queries that are not a standard query with one
 * question get FORMERR with the header alone (no question), as cheaply.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* 64 messages a batch: the most one recvmmsg returns under dnsperf's load
 * here is well below that; larger batches only cost memory. */
#define BATCH 64
/* 512 bytes: a query with a question of up to 255 bytes of name and an OPT
 * record fits; the answer adds 16 bytes. Larger queries are truncated by
 * the kernel (MSG_TRUNC) and answered FORMERR. */
#define BUF 512
/* The canned record: pointer to offset 12 (the question name), type A,
 * class IN, TTL 30, RDLENGTH 4, 192.0.2.1 (TEST-NET-1). */
static const unsigned char record[] = {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 192, 0, 2, 1};

/* question_end returns the offset just past the question (name, type,
 * class) of the query in b[0:n], or 0 when it is not a well-formed one. */
static size_t question_end(const unsigned char *b, size_t n) {
	size_t off = 12;
	for (;;) {
		if (off >= n) return 0;
		unsigned l = b[off];
		if (l == 0) break;
		if (l > 63) return 0; /* no compression in a question */
		off += 1 + l;
	}
	off += 1 + 4;
	if (off > n || off > 12 + 255 + 4) return 0;
	return off;
}

/* answer turns the query in b[0:n] into the answer in place, returning its
 * length. */
static size_t answer(unsigned char *b, size_t n) {
	if (n < 12) return 0; /* not even a header: drop */
	if (b[2] & 0x80) return 0; /* an answer: never answer answers */
	unsigned opcode = (b[2] >> 3) & 0xf;
	unsigned qd = (unsigned)b[4] << 8 | b[5];
	size_t q = (opcode == 0 && qd == 1) ? question_end(b, n) : 0;
	b[2] = (b[2] & 0x79) | 0x80; /* QR, keep opcode and RD, clear AA/TC */
	b[3] = 0x80;                 /* RA, NOERROR */
	memset(b + 6, 0, 6);         /* AN, NS, AR: set below */
	if (q == 0) {
		b[3] |= 1; /* FORMERR */
		b[4] = b[5] = 0;
		return 12;
	}
	b[7] = 1;
	memcpy(b + q, record, sizeof record);
	return q + sizeof record;
}

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
		return 2;
	}
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1) {
		fprintf(stderr, "limit: bad address %s\n", argv[1]);
		return 2;
	}
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
		perror("limit: bind");
		return 1;
	}
	/* 4 MiB: as the other servers' sockets, room for dnsperf's bursts. */
	int sz = 4 << 20;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);

	/* No SA_RESTART: a signal interrupts the blocking recvmmsg. */
	struct sigaction act = {.sa_handler = on_signal};
	sigaction(SIGTERM, &act, NULL);
	sigaction(SIGINT, &act, NULL);

	static unsigned char bufs[BATCH][BUF];
	static struct sockaddr_storage from[BATCH];
	static struct iovec iov[BATCH];
	static struct mmsghdr in[BATCH], out[BATCH];
	for (int i = 0; i < BATCH; i++) {
		iov[i] = (struct iovec){.iov_base = bufs[i], .iov_len = BUF};
		in[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_iov = &iov[i], .msg_iovlen = 1};
	}
	fprintf(stderr, "limit: serving on %s:%s\n", argv[1], argv[2]);
	unsigned long long answered = 0;
	while (!stop) {
		for (int i = 0; i < BATCH; i++) {
			in[i].msg_hdr.msg_namelen = sizeof from[i];
			in[i].msg_hdr.msg_flags = 0;
		}
		/* MSG_WAITFORONE: block for the first, then take what is queued. */
		int n = recvmmsg(fd, in, BATCH, MSG_WAITFORONE, NULL);
		if (n < 0) {
			if (errno == EINTR) continue;
			perror("limit: recvmmsg");
			return 1;
		}
		int m = 0;
		for (int i = 0; i < n; i++) {
			size_t len = in[i].msg_len;
			if (in[i].msg_hdr.msg_flags & MSG_TRUNC) len = 11; /* too long: dropped */
			len = answer(bufs[i], len);
			if (len == 0) continue;
			out[m].msg_hdr = (struct msghdr){
			    .msg_name = &from[i], .msg_namelen = in[i].msg_hdr.msg_namelen,
			    .msg_iov = &iov[i], .msg_iovlen = 1};
			iov[i].iov_len = len;
			m++;
		}
		for (int sent = 0; sent < m;) {
			int k = sendmmsg(fd, out + sent, (unsigned)(m - sent), 0);
			if (k < 0) {
				if (errno == EINTR) continue;
				break; /* a full socket buffer: the client sees a loss */
			}
			sent += k;
		}
		answered += (unsigned long long)m;
		for (int i = 0; i < n; i++) iov[i].iov_len = BUF;
	}
	fprintf(stderr, "limit: answered %llu\n", answered);
	return 0;
}
