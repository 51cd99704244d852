/* stub: one lookup through the C library's resolver, printed in a form
 * that does not depend on TTLs or IDs, so the same lookup straight to an
 * upstream and through the cache can be compared line by line.
 *
 *   stub gai NAME   getaddrinfo(NAME, AF_UNSPEC): "ok" and one address per
 *                   line, or "error <EAI code>"
 *   stub srv NAME   res_query(NAME, IN, SRV): "rcode <n> tc <0|1>" and one
 *                   "prio weight port target" per record, or
 *                   "error h_errno <n>"
 *
 * Built with gcc (glibc) and with musl-gcc -static (musl). */
#include <arpa/inet.h>
#include <arpa/nameser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <resolv.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static int gai(const char *name) {
	struct addrinfo hints, *res, *ai;
	char buf[INET6_ADDRSTRLEN];
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	int rc = getaddrinfo(name, NULL, &hints, &res);
	if (rc != 0) {
		printf("error %d\n", rc);
		return 0;
	}
	printf("ok\n");
	for (ai = res; ai; ai = ai->ai_next) {
		const void *a = ai->ai_family == AF_INET
			? (const void *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr
			: (const void *)&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
		printf("%s\n", inet_ntop(ai->ai_family, a, buf, sizeof buf));
	}
	freeaddrinfo(res);
	return 0;
}

static int srv(const char *name) {
	static unsigned char ans[65536];
	char target[NS_MAXDNAME];
	ns_msg msg;
	ns_rr rr;
	int n = res_query(name, ns_c_in, ns_t_srv, ans, sizeof ans);
	if (n < 0) {
		printf("error h_errno %d\n", h_errno);
		return 0;
	}
	if (ns_initparse(ans, n, &msg) < 0) {
		printf("error parse\n");
		return 0;
	}
	printf("rcode %d tc %d\n", ns_msg_getflag(msg, ns_f_rcode), ns_msg_getflag(msg, ns_f_tc));
	for (int i = 0; i < ns_msg_count(msg, ns_s_an); i++) {
		if (ns_parserr(&msg, ns_s_an, i, &rr) < 0) {
			printf("error parse rr %d\n", i);
			return 0;
		}
		if (ns_rr_type(rr) != ns_t_srv)
			continue;
		const unsigned char *d = ns_rr_rdata(rr);
		if (dn_expand(ns_msg_base(msg), ns_msg_end(msg), d + 6, target, sizeof target) < 0) {
			printf("error expand\n");
			return 0;
		}
		printf("%d %d %d %s\n", ns_get16(d), ns_get16(d + 2), ns_get16(d + 4), target);
	}
	return 0;
}

int main(int argc, char **argv) {
	if (argc == 3 && strcmp(argv[1], "gai") == 0)
		return gai(argv[2]);
	if (argc == 3 && strcmp(argv[1], "srv") == 0)
		return srv(argv[2]);
	fprintf(stderr, "usage: stub gai|srv NAME\n");
	return 2;
}
