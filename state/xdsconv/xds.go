package xdsconv

import (
	"fmt"
	"runtime"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/ztunnel-go/ztunnel/api/workloadapi"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/xdsclient"
)

// XDSState is the xdsclient side of a state.Writer: its handlers convert the
// Address and Authorization resources of each push and apply them to the
// Writer, which holds them (on top of an optional static local config) and
// publishes the next state.Snapshot to a state.Store. Conversion and
// building happen in the xDS client's goroutine; the data path only ever
// Loads finished snapshots.
//
// Semantics follow ztunnel's proxy state (the Writer's doc has the rest):
//
//   - Workloads are keyed by uid, services by namespace/hostname (both taken
//     from the resource content), policies by resource name. A removal names
//     a workload uid or a service key.
//   - Resources that do not convert are rejected one by one, and the rest of
//     the push is applied; the previous version of a rejected resource stays.
//   - A static local config loads first, into the same tables: xDS resources
//     with the same keys replace its entries, and xDS removals remove them.
//
// XDSState is safe for concurrent use; applies are serialized.
type XDSState struct {
	w *state.Writer
}

// NewXDSState returns an XDSState publishing to store, seeded with static
// (which may be nil; XDSState takes ownership of its values), and publishes
// the seeded snapshot. It fails if static is not a valid config on its own.
// logf (nil: discard) receives address conflicts and rebuild failures.
func NewXDSState(store *state.Store, static *LocalConfig, logf func(string, ...any)) (*XDSState, error) {
	var base *state.Base
	if static != nil {
		base = &state.Base{Workloads: static.Workloads, Services: static.Services, Policies: static.Policies}
	}
	w, err := state.NewWriter(store, base, logf)
	if err != nil {
		return nil, fmt.Errorf("local config: %w", err)
	}
	return &XDSState{w: w}, nil
}

// Register registers the Address and Authorization handlers with c.
func (x *XDSState) Register(c *xdsclient.Client) {
	c.Register(AddressType, xdsclient.HandlerFunc(x.HandleAddresses))
	c.Register(AuthorizationType, xdsclient.HandlerFunc(x.HandleAuthorizations))
}

// address is a converted Address resource: a workload or a service.
type address struct {
	w *state.Workload
	s *state.Service
}

// HandleAddresses applies a push of Address resources (an xdsclient
// Handler): it converts every resource, applies the valid ones and the
// removals, publishes the new snapshot, and returns the rejected resources.
func (x *XDSState) HandleAddresses(u *xdsclient.Update) []xdsclient.Rejection {
	return apply(x.w, u, "Address",
		func(a *workloadapi.Address) (address, error) {
			w, s, err := ConvertAddress(a)
			return address{w, s}, err
		},
		func(tx *state.Tx, name string, c address) error {
			if c.w != nil {
				if c.w.UID == name {
					// istiod names a workload by its uid: one copy of
					// the bytes serves the snapshot and the xDS
					// client's record of what it holds (and the name,
					// which ends it).
					c.w.UID = name
					nameInUID(c.w)
				}
				tx.PutWorkload(c.w)
			} else {
				tx.PutService(c.s)
			}
			return nil
		},
		removeAddress)
}

// HandleAuthorizations applies a push of Authorization resources (an
// xdsclient Handler), like HandleAddresses.
func (x *XDSState) HandleAuthorizations(u *xdsclient.Update) []xdsclient.Rejection {
	return apply(x.w, u, "Authorization", ConvertAuthorization,
		func(tx *state.Tx, name string, p *state.Policy) error {
			if owner, ok := tx.PutPolicy(name, p); !ok {
				return fmt.Errorf("%w (%s: %s)", errDuplicatePolicyKey, p.Key(), owner)
			}
			return nil
		},
		(*state.Tx).RemovePolicy)
}

// apply is one push of resources of message type M converted to C: decode
// and convert every resource (in parallel for large pushes), then, in one
// Writer update, put the valid ones (upserts first, then removals, in
// ztunnel's order) and publish. A resource that does not decode, convert or
// put is rejected with its error; should the build fail, every put one is
// rejected with the build's error.
func apply[M any, PM interface {
	*M
	proto.Message
}, C any](w *state.Writer, u *xdsclient.Update, kind string, convert func(PM) (C, error),
	put func(tx *state.Tx, name string, c C) error, remove func(tx *state.Tx, name string)) []xdsclient.Rejection {
	type converted struct {
		c   C
		err error
	}
	out := make([]converted, len(u.Resources))
	msgs := make([]PM, min(len(u.Resources), decodeBatch))
	for lo := 0; lo < len(u.Resources); lo += decodeBatch {
		batch := u.Resources[lo:min(lo+decodeBatch, len(u.Resources))]
		convertAll(len(batch), func(i int) {
			m := PM(new(M))
			if err := unmarshal(batch[i].Value, m); err != nil {
				out[lo+i].err = fmt.Errorf("%w: decoding %s: %w", ErrInvalidResource, kind, err)
				return
			}
			msgs[i] = m
		})
		convertAll(len(batch), func(i int) {
			if msgs[i] != nil {
				out[lo+i].c, out[lo+i].err = convert(msgs[i])
			}
		})
		clear(msgs)
	}

	var (
		rej   []xdsclient.Rejection
		names = make([]string, 0, len(out))
	)
	err := w.Update(func(tx *state.Tx) {
		for i, c := range out {
			name := u.Resources[i].Name
			err := c.err
			if err == nil {
				err = put(tx, name, c.c)
			}
			if err != nil {
				rej = append(rej, xdsclient.Rejection{Name: name, Err: err})
				continue
			}
			names = append(names, name)
		}
		for _, name := range u.Removed {
			remove(tx, name)
		}
	})
	if err != nil {
		err = fmt.Errorf("xdsconv: %w", err)
		for _, n := range names {
			rej = append(rej, xdsclient.Rejection{Name: n, Err: err})
		}
	}
	return rej
}

// unmarshal decodes a resource's value into m.
func unmarshal(a *anypb.Any, m proto.Message) error { return proto.Unmarshal(a.GetValue(), m) }

// removeAddress removes what an Address resource name names: a workload
// uid, else a service key (ztunnel's order).
func removeAddress(tx *state.Tx, name string) {
	if tx.RemoveWorkload(name) {
		return
	}
	if _, host, ok := strings.Cut(name, "/"); !ok || strings.Contains(host, "/") {
		return // not a service key (workload uids often contain '/')
	}
	tx.RemoveService(name)
}

// decodeBatch is how many resources of a push are decoded before they are
// converted. Decoding them all first, then converting, keeps the
// conversion's long-lived objects (records, interned strings, label sets)
// out of the spans the decoded messages fill: a message per resource
// decoded and converted in turn left the two interleaved, and once the
// messages died a third of the heap at 100,000 workloads was free slots
// that the mesh's objects kept from being returned (issue 36: heap in use
// 102 MiB for 66 MiB live; 82 MiB with batches of this size). A batch
// bounds what the decoded messages hold at once (~6 MB).
const decodeBatch = 4096

// parallelMin is the push size from which decoding and conversion are
// spread over the CPUs; below it the goroutines cost more than they save.
const parallelMin = 512

// convertAll calls convert(i) for every i in [0, n), in parallel for large
// n. The goroutines end before it returns.
func convertAll(n int, convert func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n/parallelMin)
	if workers < 2 {
		for i := range n {
			convert(i)
		}
		return
	}
	var wg sync.WaitGroup
	chunk := (n + workers - 1) / workers
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				convert(i)
			}
		})
	}
	wg.Wait()
}

// errDuplicatePolicyKey rejects a policy whose namespace/name is already
// held under another resource name.
var errDuplicatePolicyKey = fmt.Errorf("%w: another resource holds a policy with this namespace/name", ErrInvalidResource)

// Counts returns how many workloads, services and policies are held.
func (x *XDSState) Counts() (workloads, services, policies int) { return x.w.Counts() }
