/*
 * limit: the bench's lower bound on the cost of answering a DNS query. A
 * canned answer: the query's ID and question are copied, QR (and RA) set,
 * and one A record (a compression pointer to the question name, TTL 30,
 * 192.0.2.1) appended. No cache, no parsing beyond walking the question
 * name, no EDNS in the answer. Whatever a real server does on top of this
 * is its own cost: bench/run.sh reports each server's CPU per query against
 * this one's.
 *
 * UDP: one thread, one socket, blocking recvmmsg/sendmmsg in batches.
 * TCP (same address and port): a second thread with one level-triggered
 * epoll loop; per ready connection one read(2) of whatever has arrived, the
 * answers to every whole query in it, and one send(2) of them all: for a
 * batch of pipelined queries the server pays one read and one send, the
 * least a TCP server can do with plain syscalls.
 *
 * Usage: limit ADDR PORT   (e.g. limit 127.0.0.1 5306)
 * Runs until SIGTERM/SIGINT. Queries that are not a standard query with one
 * question get FORMERR with the header alone (no question), as cheaply.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
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

/* TCP: a connection's buffers. in holds what was read and not yet answered
 * (room for one message of the largest size plus its length); out the
 * answers not yet written. Reading stops while out has bytes left, so out
 * is empty when in is answered, and an answer is at most twice its framed
 * query (the query plus a 16-byte record; a query that gets an answer is at
 * least 14 bytes framed): every whole query in in is answered at once. */
#define TCP_IN (2 + 65535)
#define TCP_OUT (2 * TCP_IN)
/* More connections than this are closed at accept: dnsperf opens -c. */
#define TCP_CONNS 1024

struct conn {
	int fd;
	int writing; /* out has bytes left after a short write: EPOLLOUT */
	size_t in_len, out_off, out_len;
	unsigned char in[TCP_IN];
	unsigned char out[TCP_OUT];
};

static unsigned long long tcp_answered; /* read at exit (__atomic) */
static int tcp_conns;

static void conn_close(int ep, struct conn *c) {
	epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	free(c);
	tcp_conns--;
}

/* conn_answer answers the whole queries in c->in into c->out, keeping a
 * partial one; -1: a zero length, which no DNS message has (the connection
 * is closed). */
static int conn_answer(struct conn *c) {
	size_t off = 0;
	unsigned long long n = 0;
	while (c->in_len - off >= 2) {
		size_t len = (size_t)c->in[off] << 8 | c->in[off + 1];
		if (len == 0) return -1;
		if (c->in_len - off < 2 + len) break;
		if (c->out_len + 2 + len + sizeof record > TCP_OUT) abort(); /* see TCP_OUT */
		unsigned char *a = c->out + c->out_len;
		memcpy(a + 2, c->in + off + 2, len);
		size_t alen = answer(a + 2, len);
		off += 2 + len;
		if (alen == 0) continue; /* dropped, as over UDP */
		a[0] = (unsigned char)(alen >> 8);
		a[1] = (unsigned char)alen;
		c->out_len += 2 + alen;
		n++;
	}
	memmove(c->in, c->in + off, c->in_len - off);
	c->in_len -= off;
	__atomic_add_fetch(&tcp_answered, n, __ATOMIC_RELAXED);
	return 0;
}

/* conn_flush writes what out holds in one send(2); on a short one it
 * waits for EPOLLOUT (and stops reading) until the rest is gone. -1: the
 * connection is broken. */
static int conn_flush(int ep, struct conn *c) {
	if (c->out_off < c->out_len) {
		/* MSG_NOSIGNAL: a client gone is an error here, not SIGPIPE. */
		ssize_t k = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
		if (k < 0 && errno != EAGAIN && errno != EINTR) return -1;
		if (k > 0) c->out_off += (size_t)k;
	}
	int writing = c->out_off < c->out_len;
	if (!writing) c->out_off = c->out_len = 0;
	if (writing != c->writing) {
		struct epoll_event ev = {.events = writing ? EPOLLOUT : EPOLLIN, .data.ptr = c};
		if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) return -1;
		c->writing = writing;
	}
	return 0;
}

/* conn_ready handles one epoll event of a connection: -1 closes it. */
static int conn_ready(int ep, struct conn *c, uint32_t events) {
	if (c->writing) return conn_flush(ep, c); /* in was answered whole */
	if (events & (EPOLLERR | EPOLLHUP) && !(events & EPOLLIN)) return -1;
	ssize_t k = read(c->fd, c->in + c->in_len, TCP_IN - c->in_len);
	if (k == 0) return -1;
	if (k < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
	c->in_len += (size_t)k;
	if (conn_answer(c) < 0) return -1;
	return conn_flush(ep, c);
}

/* tcp_main serves the TCP listener lfd until the process exits. */
static void *tcp_main(void *arg) {
	int lfd = *(int *)arg;
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0) {
		perror("limit: epoll");
		exit(1);
	}
	struct epoll_event evs[64];
	for (;;) {
		int n = epoll_wait(ep, evs, 64, -1);
		if (n < 0) {
			if (errno == EINTR) continue;
			perror("limit: epoll_wait");
			exit(1);
		}
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			if (c != NULL) {
				if (conn_ready(ep, c, evs[i].events) < 0) conn_close(ep, c);
				continue;
			}
			for (;;) {
				int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
				if (fd < 0) break; /* EAGAIN, or a connection that went away */
				if (tcp_conns >= TCP_CONNS || (c = calloc(1, sizeof *c)) == NULL) {
					close(fd);
					continue;
				}
				c->fd = fd;
				/* No Nagle: answers go out at once, as every server's do
				 * (Go's sockets, Unbound's, CoreDNS's). */
				int one = 1;
				setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
				struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
				if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev) < 0) {
					close(fd);
					free(c);
					continue;
				}
				tcp_conns++;
			}
		}
	}
	return NULL;
}

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
	static int lfd;
	int one = 1;
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
	    bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(lfd, 1024) < 0) {
		perror("limit: tcp listen");
		return 1;
	}
	/* 4 MiB: as the other servers' sockets, room for dnsperf's bursts. */
	int sz = 4 << 20;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);

	/* The TCP thread starts with SIGTERM and SIGINT blocked, so they reach
	 * this one; returning from main ends it. */
	sigset_t sigs, old;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, &old);
	pthread_t tcp;
	int err = pthread_create(&tcp, NULL, tcp_main, &lfd);
	if (err != 0) {
		fprintf(stderr, "limit: pthread_create: %s\n", strerror(err));
		return 1;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);

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
	fprintf(stderr, "limit: answered %llu over UDP, %llu over TCP\n", answered,
	        __atomic_load_n(&tcp_answered, __ATOMIC_RELAXED));
	return 0;
}
