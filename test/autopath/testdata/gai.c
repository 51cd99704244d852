/* getaddrinfo for one name and family (unspec, inet, inet6): prints the
 * addresses in order, or the error code and message. Built with gcc
 * (glibc) and musl-gcc (static) by the autopath stub tests. */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: gai NAME unspec|inet|inet6\n");
		return 2;
	}
	struct addrinfo h, *res;
	memset(&h, 0, sizeof h);
	h.ai_family = !strcmp(argv[2], "inet") ? AF_INET : !strcmp(argv[2], "inet6") ? AF_INET6 : AF_UNSPEC;
	h.ai_socktype = SOCK_STREAM;
	int rc = getaddrinfo(argv[1], NULL, &h, &res);
	if (rc) {
		printf("error %d %s\n", rc, gai_strerror(rc));
		return 0;
	}
	for (struct addrinfo *p = res; p; p = p->ai_next) {
		char b[INET6_ADDRSTRLEN];
		const void *a = p->ai_family == AF_INET ? (const void *)&((struct sockaddr_in *)p->ai_addr)->sin_addr
		                                        : (const void *)&((struct sockaddr_in6 *)p->ai_addr)->sin6_addr;
		inet_ntop(p->ai_family, a, b, sizeof b);
		printf("%s\n", b);
	}
	freeaddrinfo(res);
	return 0;
}
