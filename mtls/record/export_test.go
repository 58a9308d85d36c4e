package record

// OwnsRecords reports whether c's data is protected by this package rather
// than crypto/tls (for the external tests).
func OwnsRecords(c *Conn) bool {
	own, err := c.ownRecords()
	return err == nil && own
}
