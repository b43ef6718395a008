package endpoint

import (
	"k8s.io/client-go/rest"
	clienttransport "k8s.io/client-go/transport"
)

// Bearer returns the Authorization header source for probes, if cfg has a
// bearer token.
func Bearer(cfg *rest.Config) func() string {
	return bearer(cfg.BearerToken, cfg.BearerTokenFile)
}

// bearer is Bearer for a rest.Config's BearerToken and BearerTokenFile.
func bearer(token, tokenFile string) func() string {
	static := ""
	if token != "" {
		static = "Bearer " + token
	}
	if tokenFile != "" {
		// A kubeconfig's tokenFile sets both: the file wins, re-read as it
		// rotates (as client-go's own requests do); BearerToken is what was
		// in it at start, used only while the file cannot be read.
		ts := clienttransport.NewCachedFileTokenSource(tokenFile)
		return func() string {
			t, err := ts.Token()
			if err != nil {
				return static
			}
			return "Bearer " + t.AccessToken
		}
	}
	if static != "" {
		return func() string { return static }
	}
	return nil
}
