// Package inpod is the node daemon's in-pod ("shared") mode: the ZDS client
// that takes each ambient pod's network namespace from the Istio CNI agent,
// and the lifecycle of the one proxy per pod that serves it from inside that
// namespace.
//
// The CNI agent serves a SOCK_SEQPACKET unix socket (INPOD_UDS). The Manager
// connects, says hello (V1), and answers every request with exactly one
// Ack or Nack: Add (the pod's netns fd rides in SCM_RIGHTS) starts the pod's
// proxy, Del closes it at once, Keep and SnapshotSent reconcile the pods
// after each (re)connect. A proxy that fails to start is Nacked, kept pending
// and retried every 5 s. A request that breaks the protocol is Nacked and
// ends the Manager with a *ProtocolError, on which the daemon exits 1 as
// ztunnel does; an undecodable packet is Nacked and the stream reconnected,
// while every pod's proxy keeps serving.
//
// The proxies themselves are built by the caller (Config.NewProxy) and
// receive a control function that runs socket creation inside the pod's
// namespace ([Netns.Run]). An add switches a thread into the pod's
// namespace once: a proxy that is a [SocketOpener] opens all its sockets
// in that one switch, together with tcp_migrate_req, rather than one
// switch per socket. The package knows no policy, TLS or HBONE.
//
// Imports (of ours): api/zdsapi, inpod/netns and metrics. Imported by: internal/app (the
// daemon's shared mode).
package inpod
