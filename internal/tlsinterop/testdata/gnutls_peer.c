/*
 * The GnuTLS interop peer (libgnutls): see peer.h for what it does and its
 * options. Built by the Go test with: gcc -o gnutls_peer gnutls_peer.c -lgnutls
 */
#include "peer.h"

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

static gnutls_session_t session;
static int client_hellos, keyupdates_received;
static long padded_to_max; /* records padded to the maximum */

/* hook counts, before each is processed (after, GnuTLS does not call it
 * for the ClientHello it answers with a HelloRetryRequest), the handshake messages the checks need: ClientHellos (two
 * mean a HelloRetryRequest) and the peer's KeyUpdates. */
static int hook(gnutls_session_t s, unsigned htype, unsigned when, unsigned incoming, const gnutls_datum_t *msg)
{
	(void)s, (void)msg;
	if (when != GNUTLS_HOOK_PRE)
		return 0;
	if (htype == GNUTLS_HANDSHAKE_CLIENT_HELLO)
		client_hellos++;
	if (htype == GNUTLS_HANDSHAKE_KEY_UPDATE && incoming)
		keyupdates_received++;
	return 0;
}

/* push writes through raw_send, which injects faults. */
static ssize_t push(gnutls_transport_ptr_t p, const void *data, size_t n)
{
	(void)p;
	if (raw_send(tls_fd, data, n) < 0)
		return -1;
	return (ssize_t)n;
}

static ssize_t pull(gnutls_transport_ptr_t p, void *data, size_t n)
{
	(void)p;
	for (;;) {
		ssize_t k = recv(tls_fd, data, n, 0);
		if (k < 0 && errno == EINTR)
			continue;
		return k;
	}
}

static void check(int ret, const char *what)
{
	if (ret < 0)
		die("%s: %s", what, gnutls_strerror(ret));
}

static void tls_setup(int fd)
{
	(void)fd;
	gnutls_certificate_credentials_t cred;
	check(gnutls_global_init(), "init");
	check(gnutls_certificate_allocate_credentials(&cred), "credentials");
	check(gnutls_certificate_set_x509_trust_file(cred, opt.ca, GNUTLS_X509_FMT_PEM), "trust file");
	check(gnutls_certificate_set_x509_key_file(cred, opt.cert, opt.key, GNUTLS_X509_FMT_PEM), "key file");
	/* With -groups, one key share only, for the first group: the way to
	 * offer a share the server does not pick. */
	unsigned flags = opt.server ? GNUTLS_SERVER : GNUTLS_CLIENT | (opt.groups ? GNUTLS_KEY_SHARE_TOP : 0);
	check(gnutls_init(&session, flags), "session");
	char prio[512];
	snprintf(prio, sizeof prio, "NORMAL:-VERS-ALL:+VERS-TLS1.3%s%s", opt.groups ? ":-GROUP-ALL:" : "",
		 opt.groups ? opt.groups : "");
	const char *errpos;
	if (gnutls_priority_set_direct(session, prio, &errpos) < 0)
		die("priority %s at %s", prio, errpos);
	check(gnutls_credentials_set(session, GNUTLS_CRD_CERTIFICATE, cred), "set credentials");
	if (opt.server)
		gnutls_certificate_server_set_request(session, GNUTLS_CERT_REQUIRE);
	gnutls_datum_t alpn = {(unsigned char *)"h2", 2};
	check(gnutls_alpn_set_protocols(session, &alpn, 1, 0), "alpn");
	gnutls_handshake_set_hook_function(session, GNUTLS_HANDSHAKE_ANY, GNUTLS_HOOK_BOTH, hook);
	gnutls_transport_set_push_function(session, push);
	gnutls_transport_set_pull_function(session, pull);
	int ret;
	do {
		ret = gnutls_handshake(session);
	} while (ret < 0 && !gnutls_error_is_fatal(ret));
	if (ret < 0) {
		if (ret == GNUTLS_E_FATAL_ALERT_RECEIVED)
			event("alert_received %d %s", gnutls_alert_get(session),
			      gnutls_alert_get_name(gnutls_alert_get(session)));
		die("handshake: %s", gnutls_strerror(ret));
	}
	/* Chain verification only: the certificates carry SPIFFE URIs, no
	 * host names. */
	unsigned status;
	check(gnutls_certificate_verify_peers2(session, &status), "verify");
	if (status != 0)
		die("peer certificate does not verify: status 0x%x", status);
	event("handshake version=%s cipher=%s group=%s client_hellos=%d",
	      gnutls_protocol_get_name(gnutls_protocol_get_version(session)),
	      gnutls_cipher_get_name(gnutls_cipher_get(session)), gnutls_group_get_name(gnutls_group_get(session)),
	      client_hellos);
}

static long tls_read(void *buf, size_t n)
{
	for (;;) {
		ssize_t k = gnutls_record_recv(session, buf, n);
		if (k >= 0)
			return k;
		switch (k) {
		case GNUTLS_E_AGAIN:
		case GNUTLS_E_INTERRUPTED:
			continue;
		case GNUTLS_E_PREMATURE_TERMINATION:
			event("premature_termination %s", gnutls_strerror(k));
			return -1;
		case GNUTLS_E_FATAL_ALERT_RECEIVED:
			event("alert_received %d %s", gnutls_alert_get(session),
			      gnutls_alert_get_name(gnutls_alert_get(session)));
			return -1;
		case GNUTLS_E_WARNING_ALERT_RECEIVED:
			event("warning_alert_received %d", gnutls_alert_get(session));
			continue;
		default:
			if (!gnutls_error_is_fatal(k))
				continue;
			event("error read: %s", gnutls_strerror(k));
			return -1;
		}
	}
}

static int tls_pending(void) { return gnutls_record_check_pending(session) > 0; }

static int tls_write(const void *buf, size_t n)
{
	const char *b = buf;
	while (n > 0) {
		size_t k = n > 16384 ? 16384 : n;
		size_t pad = 0;
		if (opt.pad > 0) {
			/* GnuTLS takes padding up to the record size less its
			 * overhead (gnutls_record_send2's documentation), and
			 * content and padding together up to the record size. */
			size_t max = gnutls_record_get_max_size(session);
			size_t over = gnutls_record_overhead_size(session);
			size_t room = max > over ? max - over : 0;
			pad = (size_t)opt.pad < room ? (size_t)opt.pad : room;
			if (k + pad > max)
				pad = max > k ? max - k : 0;
			if (pad > 0 && k + pad == max)
				padded_to_max++;
		}
		ssize_t r = pad ? gnutls_record_send2(session, b, k, pad, 0) : gnutls_record_send(session, b, k);
		if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED)
			continue;
		if (r < 0) {
			event("error write: %s", gnutls_strerror(r));
			return -1;
		}
		b += r;
		n -= r;
	}
	return 0;
}

static void tls_close_write(void)
{
	int r;
	do {
		r = gnutls_bye(session, GNUTLS_SHUT_WR);
	} while (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED);
	if (r < 0)
		event("error bye: %s", gnutls_strerror(r));
}

static void tls_key_update(int request)
{
	int r = gnutls_session_key_update(session, request ? GNUTLS_KU_PEER : 0);
	if (r < 0)
		event("error key update: %s", gnutls_strerror(r));
}

static int tls_keyupdates_received(void) { return keyupdates_received; }

static long tls_padded_to_max(void) { return padded_to_max; }

int main(int argc, char **argv) { return peer_main(argc, argv); }
