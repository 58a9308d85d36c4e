package record

import (
	"errors"
	"fmt"
)

// alert is a TLS alert description (RFC 8446 section 6).
type alert uint8

const (
	alertCloseNotify       alert = 0
	alertUnexpectedMessage alert = 10
	alertBadRecordMAC      alert = 20
	alertRecordOverflow    alert = 22
	alertIllegalParameter  alert = 47
	alertDecodeError       alert = 50
	alertInternalError     alert = 80
	alertUserCanceled      alert = 90
)

var alertNames = map[alert]string{
	0:   "close_notify",
	10:  "unexpected_message",
	20:  "bad_record_mac",
	22:  "record_overflow",
	40:  "handshake_failure",
	42:  "bad_certificate",
	43:  "unsupported_certificate",
	44:  "certificate_revoked",
	45:  "certificate_expired",
	46:  "certificate_unknown",
	47:  "illegal_parameter",
	48:  "unknown_ca",
	49:  "access_denied",
	50:  "decode_error",
	51:  "decrypt_error",
	70:  "protocol_version",
	71:  "insufficient_security",
	80:  "internal_error",
	86:  "inappropriate_fallback",
	90:  "user_canceled",
	109: "missing_extension",
	110: "unsupported_extension",
	112: "unrecognized_name",
	113: "bad_certificate_status_response",
	115: "unknown_psk_identity",
	116: "certificate_required",
	120: "no_application_protocol",
}

func (a alert) String() string {
	if s, ok := alertNames[a]; ok {
		return s
	}
	return fmt.Sprintf("alert(%d)", uint8(a))
}

// AlertError is the error a Read returns after the peer sent an alert other
// than close_notify (and user_canceled, which is skipped): the peer has
// failed the connection.
type AlertError uint8

func (e AlertError) Error() string {
	return fmt.Sprintf("record: peer sent alert %s (%d)", alert(e), uint8(e))
}

// ProtocolError is the error a Read returns when the peer broke the record
// protocol (a record that fails authentication, is too long, has an
// unexpected type, ...). Alert is the alert the connection owes the peer: the
// next Write or Close sends it.
type ProtocolError struct {
	Alert  uint8
	Reason string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("record: %s (%s)", e.Reason, alert(e.Alert))
}

// errShutdown is returned by writes after close_notify was sent.
var errShutdown = errors.New("record: write after close_notify")

// errFailed is returned by writes once the connection sent a fatal alert.
var errFailed = errors.New("record: connection failed")
