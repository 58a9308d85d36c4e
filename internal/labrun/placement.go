package labrun

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ztunnel-go/ztunnel/internal/netnslab"
	"github.com/ztunnel-go/ztunnel/mtls/caclient"
	"github.com/ztunnel-go/ztunnel/state"
	"github.com/ztunnel-go/ztunnel/state/xdsconv"
)

// parseTopology reads a cluster's config: the workloads in file order (the
// snapshot sorts them) and the snapshot the daemons will build from it.
func parseTopology(config []byte) (*xdsconv.LocalConfig, *state.Snapshot, error) {
	lc, err := xdsconv.ParseLocalConfig(config)
	if err != nil {
		return nil, nil, err
	}
	snap, err := lc.Snapshot()
	if err != nil {
		return nil, nil, err
	}
	return lc, snap, nil
}

// clusterFiles are the files both kinds of cluster hand their daemons.
type clusterFiles struct {
	caCert, caKey, config string
}

// writeClusterFiles writes the CA's root and key and the config into dir,
// where the daemons read them.
func writeClusterFiles(dir string, ca *caclient.BuiltinCA, config []byte) (clusterFiles, error) {
	f := clusterFiles{
		caCert: filepath.Join(dir, "ca-cert.pem"),
		caKey:  filepath.Join(dir, "ca-key.pem"),
		config: filepath.Join(dir, "config.yaml"),
	}
	for path, data := range map[string][]byte{f.caCert: ca.RootPEM(), f.caKey: ca.KeyPEM(), f.config: config} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return clusterFiles{}, err
		}
	}
	return f, nil
}

// placement creates the config's nodes on first use and its pods on them,
// in file order, so that the lab's addresses are the ones the config gives
// (node N's pods get 10.244.N.2, .3, ...).
type placement struct {
	lab   *netnslab.Lab
	nodes map[string]*netnslab.Node
	pods  map[string]*netnslab.Pod
}

func newPlacement(lab *netnslab.Lab, nodes map[string]*netnslab.Node, pods map[string]*netnslab.Pod) *placement {
	return &placement{lab: lab, nodes: nodes, pods: pods}
}

// node returns the node called name, creating it the first time.
func (pl *placement) node(name string) (*netnslab.Node, error) {
	if n, ok := pl.nodes[name]; ok {
		return n, nil
	}
	n, err := pl.lab.AddNode(name)
	if err != nil {
		return nil, err
	}
	pl.nodes[name] = n
	return n, nil
}

// workload adds w's pod on its node and checks the lab gave it the address
// the config does.
func (pl *placement) workload(w *state.Workload) (*netnslab.Pod, error) {
	if w.Node() == "" {
		return nil, fmt.Errorf("labrun: workload %s needs a node", w.UID)
	}
	n, err := pl.node(w.Node())
	if err != nil {
		return nil, err
	}
	p, err := n.AddPod(w.Name)
	if err != nil {
		return nil, err
	}
	if len(w.Addresses) == 0 || w.Addresses[0] != p.IP {
		return nil, fmt.Errorf("labrun: config gives workload %s the address %v, but the lab assigned %s (pods are numbered in file order per node, from 10.244.<node>.2)", w.Name, w.Addresses, p.IP)
	}
	pl.pods[w.Name] = p
	return p, nil
}

// extra adds the pods no workload describes (ClusterOptions.ExtraPods,
// SharedOptions.ExtraPods), after the workloads' own.
func (pl *placement) extra(pods map[string][]string) error {
	for nodeName, names := range pods {
		n, err := pl.node(nodeName)
		if err != nil {
			return err
		}
		for _, name := range names {
			p, err := n.AddPod(name)
			if err != nil {
				return err
			}
			pl.pods[name] = p
		}
	}
	return nil
}
