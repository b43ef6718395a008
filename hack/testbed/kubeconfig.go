package testbed

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Target is where a client config points. Its string form names the
// kubeconfig file in the bed's directory ("<target>.kubeconfig").
type Target string

const (
	// Origin is the control-plane endpoint as a failover client knows it:
	// server https://10.250.0.1:6443 (the first apiserver, so no DNS is
	// needed) with tls-server-name OriginName.
	Origin Target = "origin"
	// LocalProxy is the node-local proxy: server https://127.0.0.1:7445
	// (Options.LocalProxyAddr) with tls-server-name OriginName.
	LocalProxy Target = "localproxy"
)

// Direct is the target talking to apiserver k only (https://10.250.0.k:6443,
// tls-server-name OriginName).
func Direct(k int) Target { return Target("apiserver-" + strconv.Itoa(k)) }

// Identity is who a client config authenticates as (bearer tokens from the
// apiservers' --token-auth-file).
type Identity string

const (
	// Admin is user "admin" in group system:masters.
	Admin Identity = "admin"
	// Node is user "system:node:node-1" in group system:nodes: what a
	// kubelet is. The Node authorizer lets it get core endpoints but not
	// read endpointslices.
	Node Identity = "node"
	// LocalProxyIdentity is the ServiceAccount
	// kube-system/apifailover-localproxy (a static token for its user name
	// system:serviceaccount:kube-system:apifailover-localproxy), bound to
	// ClusterRole apifailover-localproxy: get/list/watch endpointslices,
	// get endpoints, get nodes.
	LocalProxyIdentity Identity = "localproxy"
)

const (
	nodeName           = "node-1"
	localProxyName     = "apifailover-localproxy"
	localProxyNS       = "kube-system"
	localProxyUserName = "system:serviceaccount:" + localProxyNS + ":" + localProxyName
)

// identity is one line of the token auth file.
type identity struct {
	token  string
	user   string
	groups []string
}

func newIdentities() (map[Identity]identity, error) {
	ids := map[Identity]identity{
		Admin:              {user: "admin", groups: []string{"system:masters"}},
		Node:               {user: "system:node:" + nodeName, groups: []string{"system:nodes"}},
		LocalProxyIdentity: {user: localProxyUserName, groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + localProxyNS}},
	}
	for k, id := range ids {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		id.token = hex.EncodeToString(b)
		ids[k] = id
	}
	return ids, nil
}

// writeTokenFile writes the --token-auth-file: token,user,uid,"groups".
func writeTokenFile(path string, ids map[Identity]identity) error {
	var sb strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&sb, "%s,%s,%s,\"%s\"\n", id.token, id.user, id.user, strings.Join(id.groups, ","))
	}
	return os.WriteFile(path, []byte(sb.String()), 0o600)
}

// server returns the URL a target points at.
func (b *Bed) server(t Target) (string, error) {
	switch {
	case t == Origin:
		return "https://" + apiserverHost(1) + ":" + strconv.Itoa(APIServerPort), nil
	case t == LocalProxy:
		return "https://" + b.localProxyAddr, nil
	case strings.HasPrefix(string(t), "apiserver-"):
		k, err := strconv.Atoi(strings.TrimPrefix(string(t), "apiserver-"))
		if err != nil || k < 1 || k > MaxAPIServers {
			return "", fmt.Errorf("testbed: bad target %q", t)
		}
		return "https://" + apiserverHost(k) + ":" + strconv.Itoa(APIServerPort), nil
	}
	return "", fmt.Errorf("testbed: bad target %q", t)
}

// RESTConfig returns a fresh admin client config for target t. It panics on
// an unknown target (a programming error).
func (b *Bed) RESTConfig(t Target) *rest.Config { return b.RESTConfigAs(t, Admin) }

// RESTConfigAs returns a fresh client config for target t authenticated as
// id. The TLS server name is always OriginName.
func (b *Bed) RESTConfigAs(t Target, id Identity) *rest.Config {
	server, err := b.server(t)
	if err != nil {
		panic(err)
	}
	who, ok := b.ids[id]
	if !ok {
		panic(fmt.Sprintf("testbed: unknown identity %q", id))
	}
	return &rest.Config{
		Host:        server,
		BearerToken: who.token,
		TLSClientConfig: rest.TLSClientConfig{
			ServerName: OriginName,
			CAData:     append([]byte(nil), b.pki.ca.certPEM...),
		},
		UserAgent: "apifailover-testbed",
	}
}

// Token returns the bearer token of id.
func (b *Bed) Token(id Identity) string { return b.ids[id].token }

// AdminToken returns the admin bearer token.
func (b *Bed) AdminToken() string { return b.Token(Admin) }

// KubeconfigPath is the kubeconfig (admin credentials) for target t in the
// bed's directory: origin.kubeconfig, localproxy.kubeconfig,
// apiserver-K.kubeconfig.
func (b *Bed) KubeconfigPath(t Target) string {
	return filepath.Join(b.dir, string(t)+".kubeconfig")
}

// WriteKubeconfig writes a kubeconfig for target t and identity id to path.
func (b *Bed) WriteKubeconfig(path string, t Target, id Identity) error {
	server, err := b.server(t)
	if err != nil {
		return err
	}
	who, ok := b.ids[id]
	if !ok {
		return fmt.Errorf("testbed: unknown identity %q", id)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testbed"] = &clientcmdapi.Cluster{
		Server:                   server,
		TLSServerName:            OriginName,
		CertificateAuthorityData: b.pki.ca.certPEM,
	}
	cfg.AuthInfos[string(id)] = &clientcmdapi.AuthInfo{Token: who.token}
	cfg.Contexts["testbed"] = &clientcmdapi.Context{Cluster: "testbed", AuthInfo: string(id)}
	cfg.CurrentContext = "testbed"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("testbed: write %s: %w", path, err)
	}
	return nil
}

// writeKubeconfigs writes the admin kubeconfigs for targets.
func (b *Bed) writeKubeconfigs(targets ...Target) error {
	for _, t := range targets {
		if err := b.WriteKubeconfig(b.KubeconfigPath(t), t, Admin); err != nil {
			return err
		}
	}
	return nil
}
