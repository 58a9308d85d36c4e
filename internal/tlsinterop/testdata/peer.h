/*
 * The part of the interop peers that is not TLS: options, sockets, the
 * report lines, the faults injected on the wire, and the pump that moves
 * bytes between the TLS connection and a plaintext TCP connection to the
 * Go test. Each peer (openssl_peer.c, gnutls_peer.c) supplies the tls_*
 * functions over its own library.
 *
 * Usage: peer -role client|server [-connect HOST:PORT] -plain HOST:PORT
 *             -cert FILE -key FILE -ca FILE [-groups LIST] [-pad N]
 *             [-keyupdate-at N [-keyupdate-request]] [-tamper-at N]
 *             [-cut-at N -cut fin|rst]
 *
 * A server listens on 127.0.0.1 and prints "LISTEN <port>" on stdout. Once
 * the handshake is done the peer connects to -plain and copies: TLS
 * application data to the plaintext connection, plaintext to TLS. The
 * plaintext side's end makes the peer send close_notify; the peer's
 * close_notify makes it shut the plaintext side's write half. Every fact
 * the test checks is a line "EVENT <name> [details]" on stderr.
 *
 * -pad N: pad every record (OpenSSL: to a multiple of N bytes; GnuTLS: by
 * N bytes); 16384 pads every record to the largest inner plaintext,
 * 2^14+1 bytes (GnuTLS: as far as its own limits let it).
 * -keyupdate-at N: once N bytes of application data are sent, send a
 * KeyUpdate (with update_requested under -keyupdate-request).
 * -tamper-at N: once N bytes are sent, flip one ciphertext byte of the
 * next record. -cut-at N: once N bytes are sent, write half of the next
 * record, then end the TCP connection with FIN (shutdown) or RST. After
 * either fault the peer writes nothing more and only reads.
 */
#ifndef PEER_H
#define PEER_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct options {
	int server;
	const char *connect_addr, *plain_addr, *cert, *key, *ca, *groups;
	long pad;
	long long keyupdate_at, tamper_at, cut_at;
	int keyupdate_request, cut_rst;
};

static struct options opt = {.keyupdate_at = -1, .tamper_at = -1, .cut_at = -1};

/* Wire faults, armed by the pump and applied by raw_send. */
static int tamper_armed, cut_armed;
static int tls_fd = -1;

static void event(const char *fmt, ...)
{
	va_list ap;
	fputs("EVENT ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	fflush(stderr);
}

static void die(const char *fmt, ...)
{
	va_list ap;
	fputs("EVENT fatal ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

static void usage(void)
{
	die("usage: peer -role client|server -plain HOST:PORT -cert F -key F -ca F [-connect HOST:PORT] ...");
}

static void parse_options(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define VAL() (v ? (i++, v) : (usage(), ""))
		if (!strcmp(a, "-role")) {
			opt.server = !strcmp(VAL(), "server");
		} else if (!strcmp(a, "-connect")) {
			opt.connect_addr = VAL();
		} else if (!strcmp(a, "-plain")) {
			opt.plain_addr = VAL();
		} else if (!strcmp(a, "-cert")) {
			opt.cert = VAL();
		} else if (!strcmp(a, "-key")) {
			opt.key = VAL();
		} else if (!strcmp(a, "-ca")) {
			opt.ca = VAL();
		} else if (!strcmp(a, "-groups")) {
			opt.groups = VAL();
		} else if (!strcmp(a, "-pad")) {
			opt.pad = atol(VAL());
		} else if (!strcmp(a, "-keyupdate-at")) {
			opt.keyupdate_at = atoll(VAL());
		} else if (!strcmp(a, "-keyupdate-request")) {
			opt.keyupdate_request = 1;
		} else if (!strcmp(a, "-tamper-at")) {
			opt.tamper_at = atoll(VAL());
		} else if (!strcmp(a, "-cut-at")) {
			opt.cut_at = atoll(VAL());
		} else if (!strcmp(a, "-cut")) {
			opt.cut_rst = !strcmp(VAL(), "rst");
		} else {
			usage();
		}
#undef VAL
	}
	if (!opt.plain_addr || !opt.cert || !opt.key || !opt.ca || (!opt.server && !opt.connect_addr))
		usage();
}

static struct sockaddr_in parse_addr(const char *s)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	char host[64];
	const char *colon = strrchr(s, ':');
	if (!colon || (size_t)(colon - s) >= sizeof host)
		die("bad address %s", s);
	memcpy(host, s, colon - s);
	host[colon - s] = 0;
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		die("bad address %s", s);
	sa.sin_port = htons(atoi(colon + 1));
	return sa;
}

static int dial(const char *addr)
{
	struct sockaddr_in sa = parse_addr(addr);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
		die("connect %s: %s", addr, strerror(errno));
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

/* listen_once listens on 127.0.0.1, prints the port and accepts one
 * connection. */
static int listen_once(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t len = sizeof sa;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int ln = socket(AF_INET, SOCK_STREAM, 0);
	if (ln < 0 || bind(ln, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(ln, 1) < 0 ||
	    getsockname(ln, (struct sockaddr *)&sa, &len) < 0)
		die("listen: %s", strerror(errno));
	printf("LISTEN %d\n", ntohs(sa.sin_port));
	fflush(stdout);
	int fd = accept(ln, NULL, NULL);
	if (fd < 0)
		die("accept: %s", strerror(errno));
	close(ln);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

static int write_all(int fd, const void *p, size_t n)
{
	const char *b = p;
	while (n > 0) {
		ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		b += k;
		n -= k;
	}
	return 0;
}

/* raw_send writes TLS bytes to the socket, applying an armed fault to the
 * first record of the write (the libraries write whole records). It
 * returns 0, or -1 with errno set. */
static int raw_send(int fd, const unsigned char *p, size_t n)
{
	if (tamper_armed && n > 6) {
		unsigned char *copy = malloc(n);
		memcpy(copy, p, n);
		copy[6] ^= 0x01; /* the second ciphertext byte of the record */
		tamper_armed = 0;
		event("tampered");
		int r = write_all(fd, copy, n);
		free(copy);
		return r;
	}
	if (cut_armed && n > 6) {
		cut_armed = 0;
		size_t half = n / 2 > 6 ? n / 2 : 6;
		if (write_all(fd, p, half) < 0)
			return -1;
		if (opt.cut_rst) {
			struct linger l = {.l_onoff = 1, .l_linger = 0};
			setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
			event("cut rst");
			close(fd);
			exit(0);
		}
		shutdown(fd, SHUT_WR);
		event("cut fin");
		return 0; /* the library believes the record went out */
	}
	return write_all(fd, p, n);
}

/* What each peer implements over its library. */

/* tls_setup makes the TLS connection over fd and runs the handshake;
 * it reports "EVENT handshake ...". */
static void tls_setup(int fd);
/* tls_read returns data bytes, 0 at close_notify, or -1 when the
 * connection failed (reported as events). */
static long tls_read(void *buf, size_t n);
/* tls_pending reports whether decrypted or buffered bytes await tls_read. */
static int tls_pending(void);
/* tls_write writes all n bytes, -1 on failure. */
static int tls_write(const void *buf, size_t n);
/* tls_close_write sends close_notify. */
static void tls_close_write(void);
/* tls_key_update sends a KeyUpdate. */
static void tls_key_update(int request);
/* tls_keyupdates_received counts the peer's KeyUpdates. */
static int tls_keyupdates_received(void);
/* tls_padded_to_max counts the records sent padded to the largest inner
 * plaintext (2^14+1 bytes). */
static long tls_padded_to_max(void);

/* pump copies both ways until both directions have ended. */
static int pump(int plain)
{
	static unsigned char buf[64 << 10];
	long long sent = 0, received = 0;
	int tls_open = 1, plain_open = 1, failed = 0;
	while ((tls_open || plain_open) && !failed) {
		struct pollfd p[2] = {{.fd = tls_open ? tls_fd : -1, .events = POLLIN},
				      {.fd = plain_open ? plain : -1, .events = POLLIN}};
		if (!(tls_open && tls_pending())) {
			if (poll(p, 2, -1) < 0) {
				if (errno == EINTR)
					continue;
				die("poll: %s", strerror(errno));
			}
		} else {
			p[0].revents = POLLIN;
			p[1].revents = 0;
		}
		if (tls_open && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
			long n = tls_read(buf, sizeof buf);
			if (n > 0) {
				received += n;
				if (write_all(plain, buf, n) < 0)
					die("plaintext write: %s", strerror(errno));
			} else if (n == 0) {
				event("close_notify");
				shutdown(plain, SHUT_WR);
				tls_open = 0;
			} else {
				failed = 1;
			}
		}
		if (plain_open && !failed && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
			/* Faults and key updates happen at exact offsets: read
			 * no further than the next one. */
			size_t want = sizeof buf;
			long long marks[3] = {opt.keyupdate_at, opt.tamper_at, opt.cut_at};
			for (int i = 0; i < 3; i++)
				if (marks[i] > sent && (size_t)(marks[i] - sent) < want)
					want = marks[i] - sent;
			ssize_t n = read(plain, buf, want);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				tls_close_write();
				event("close_notify_sent");
				plain_open = 0;
				continue;
			}
			if (tls_write(buf, n) < 0) {
				failed = 1;
				break;
			}
			sent += n;
			if (opt.keyupdate_at >= 0 && sent >= opt.keyupdate_at) {
				opt.keyupdate_at = -1;
				tls_key_update(opt.keyupdate_request);
				event("keyupdate_sent request=%d", opt.keyupdate_request);
			}
			if (opt.tamper_at >= 0 && sent >= opt.tamper_at) {
				opt.tamper_at = -1;
				tamper_armed = 1;
			}
			if (opt.cut_at >= 0 && sent >= opt.cut_at) {
				opt.cut_at = -1;
				cut_armed = 1;
			}
			if (tamper_armed || cut_armed) {
				/* The fault goes into a record of its own: one more
				 * byte, which the Go side must never see, carries it. */
				static const unsigned char x = 'x';
				if (tls_write(&x, 1) < 0) {
					failed = 1;
					break;
				}
				/* Nothing more is written after the fault: the peer
				 * waits for our answer (an alert, close_notify) with
				 * nothing of its own in flight. */
				plain_open = 0;
			}
		}
	}
	event("done sent=%lld received=%lld keyupdates_received=%d padded_to_max=%ld failed=%d", sent, received,
	      tls_keyupdates_received(), tls_padded_to_max(), failed);
	return failed;
}

static int peer_main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	parse_options(argc, argv);
	tls_fd = opt.server ? listen_once() : dial(opt.connect_addr);
	tls_setup(tls_fd);
	int plain = dial(opt.plain_addr);
	int failed = pump(plain);
	close(plain);
	close(tls_fd);
	return failed ? 1 : 0;
}

#endif
