// Package proxy makes the per-connection decisions of the node proxy:
// outbound (15001: where is this connection going, over HBONE or plain TCP),
// inbound HBONE (15008: who is calling, may they, where to), and inbound
// passthrough (15006: plaintext into a pod, policy without identity).
//
// Each decision runs once per connection in an ordinary goroutine and ends by
// handing both sockets to engine.Relay. The proxy reads the workload/policy
// snapshot once per connection and never locks on it.
//
// Imported by cmd and inpod; imports engine, hbone, mtls, state.
package proxy
