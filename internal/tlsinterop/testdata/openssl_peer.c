/*
 * The OpenSSL interop peer (libssl): see peer.h for what it does and its
 * options. Built by the Go test with: gcc -o openssl_peer openssl_peer.c -lssl -lcrypto
 */
#include "peer.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

static SSL *ssl;
static int client_hellos, keyupdates_received;
static long padded_to_max; /* records padded to the maximum */

/* msg_cb counts the handshake messages the checks need: ClientHellos (two
 * mean a HelloRetryRequest) and the peer's KeyUpdates. */
static void msg_cb(int write_p, int version, int content_type, const void *buf, size_t len, SSL *s, void *arg)
{
	(void)version, (void)s, (void)arg;
	const unsigned char *b = buf;
	if (content_type != SSL3_RT_HANDSHAKE || len < 1)
		return;
	if (b[0] == SSL3_MT_CLIENT_HELLO)
		client_hellos++;
	if (b[0] == SSL3_MT_KEY_UPDATE && !write_p)
		keyupdates_received++;
}

/* pad_to_max pads every record to the largest inner plaintext, 2^14+1
 * bytes; OpenSSL caps what it returns at the room left. len counts the
 * content type byte. */
static size_t pad_to_max(SSL *s, int type, size_t len, void *arg)
{
	(void)s, (void)type, (void)arg;
	if (len >= 16385)
		return 0;
	padded_to_max++;
	return 16385 - len;
}

/* info_cb reports alerts both ways. */
static void info_cb(const SSL *s, int where, int ret)
{
	(void)s;
	if (where & SSL_CB_ALERT)
		event("%s %d %s", (where & SSL_CB_READ) ? "alert_received" : "alert_sent", ret & 0xff,
		      SSL_alert_desc_string_long(ret));
}

/* The write BIO: a socket write through raw_send, which injects faults. */
static int bio_write(BIO *b, const char *data, int len)
{
	(void)b;
	if (raw_send(tls_fd, (const unsigned char *)data, len) < 0)
		return -1;
	return len;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	(void)b, (void)num, (void)ptr;
	return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int bio_create(BIO *b)
{
	BIO_set_init(b, 1);
	return 1;
}

static void report_errors(const char *what)
{
	unsigned long e;
	while ((e = ERR_get_error()) != 0) {
		char s[256];
		ERR_error_string_n(e, s, sizeof s);
		if (ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
			event("unexpected_eof %s", s);
		else
			event("error %s: %s", what, s);
	}
}

static void tls_setup(int fd)
{
	SSL_CTX *ctx = SSL_CTX_new(opt.server ? TLS_server_method() : TLS_client_method());
	if (!ctx)
		die("SSL_CTX_new");
	SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
	if (SSL_CTX_use_certificate_chain_file(ctx, opt.cert) != 1 ||
	    SSL_CTX_use_PrivateKey_file(ctx, opt.key, SSL_FILETYPE_PEM) != 1 ||
	    SSL_CTX_load_verify_locations(ctx, opt.ca, NULL) != 1) {
		report_errors("credentials");
		die("credentials");
	}
	/* Chain verification only: the certificates carry SPIFFE URIs, no
	 * host names. */
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
	if (opt.groups && SSL_CTX_set1_groups_list(ctx, opt.groups) != 1)
		die("groups %s", opt.groups);
	if (opt.pad >= 16384)
		SSL_CTX_set_record_padding_callback(ctx, pad_to_max);
	else if (opt.pad > 0 && SSL_CTX_set_block_padding(ctx, opt.pad) != 1)
		die("padding %ld", opt.pad);
	SSL_CTX_set_msg_callback(ctx, msg_cb);
	SSL_CTX_set_info_callback(ctx, info_cb);
	ssl = SSL_new(ctx);
	static const unsigned char alpn[] = {2, 'h', '2'};
	if (!opt.server)
		SSL_set_alpn_protos(ssl, alpn, sizeof alpn);
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "faults");
	BIO_meth_set_write(m, bio_write);
	BIO_meth_set_ctrl(m, bio_ctrl);
	BIO_meth_set_create(m, bio_create);
	BIO *wbio = BIO_new(m);
	BIO *rbio = BIO_new_socket(fd, BIO_NOCLOSE);
	SSL_set_bio(ssl, rbio, wbio);
	int r = opt.server ? SSL_accept(ssl) : SSL_connect(ssl);
	if (r != 1) {
		report_errors("handshake");
		die("handshake failed");
	}
	const char *group = SSL_group_to_name(ssl, SSL_get_negotiated_group(ssl));
	event("handshake version=%s cipher=%s group=%s client_hellos=%d", SSL_get_version(ssl),
	      SSL_CIPHER_get_name(SSL_get_current_cipher(ssl)), group ? group : "?", client_hellos);
}

static long tls_read(void *buf, size_t n)
{
	for (;;) {
		int k = SSL_read(ssl, buf, (int)n);
		if (k > 0)
			return k;
		switch (SSL_get_error(ssl, k)) {
		case SSL_ERROR_ZERO_RETURN:
			return 0;
		case SSL_ERROR_WANT_READ:
		case SSL_ERROR_WANT_WRITE:
			continue;
		case SSL_ERROR_SYSCALL:
			report_errors("read");
			event("error read: syscall %s", errno ? strerror(errno) : "eof");
			return -1;
		default:
			report_errors("read");
			return -1;
		}
	}
}

static int tls_pending(void) { return SSL_pending(ssl) > 0; }

static int tls_write(const void *buf, size_t n)
{
	if (n == 0)
		return 0;
	int k = SSL_write(ssl, buf, (int)n);
	if (k <= 0) {
		report_errors("write");
		event("error write: %d", SSL_get_error(ssl, k));
		return -1;
	}
	return 0;
}

static void tls_close_write(void)
{
	if (SSL_shutdown(ssl) < 0)
		report_errors("shutdown");
}

static void tls_key_update(int request)
{
	if (SSL_key_update(ssl, request ? SSL_KEY_UPDATE_REQUESTED : SSL_KEY_UPDATE_NOT_REQUESTED) != 1 ||
	    SSL_do_handshake(ssl) != 1)
		report_errors("key update");
}

static int tls_keyupdates_received(void) { return keyupdates_received; }

static long tls_padded_to_max(void) { return padded_to_max; }

int main(int argc, char **argv) { return peer_main(argc, argv); }
