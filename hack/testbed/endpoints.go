package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// readyEndpointsVia lists the kubernetes EndpointSlices through server s
// and returns the Ready endpoints as sorted "ip:port".
func readyEndpointsVia(ctx context.Context, s *APIServer) ([]string, error) {
	cs, err := s.Clientset()
	if err != nil {
		return nil, err
	}
	list, err := cs.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=kubernetes",
	})
	if err != nil {
		return nil, fmt.Errorf("via %s: %w", s.name, err)
	}
	var addrs []string
	for _, slice := range list.Items {
		port := APIServerPort
		for _, p := range slice.Ports {
			if p.Port != nil && (p.Name == nil || *p.Name == "https") {
				port = int(*p.Port)
			}
		}
		for _, ep := range slice.Endpoints {
			// A nil Ready condition means ready (discovery/v1 semantics).
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				addrs = append(addrs, net.JoinHostPort(a, strconv.Itoa(port)))
			}
		}
	}
	slices.Sort(addrs)
	return slices.Compact(addrs), nil
}

// ReadyEndpoints returns the Ready endpoints ("ip:port", sorted) of the
// kubernetes EndpointSlices in default, asking the running, unfaulted
// apiservers in turn.
func (b *Bed) ReadyEndpoints(ctx context.Context) ([]string, error) {
	var errs []error
	for _, s := range b.APIServers() {
		if !s.Running() || s.Hung() || s.NetworkFault() != "" || s.Slowed() || s.CertFault() != "" {
			continue
		}
		addrs, err := readyEndpointsVia(ctx, s)
		if err == nil {
			return addrs, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, errors.New("no running apiserver to ask")
	}
	return nil, errors.Join(errs...)
}

// WaitEndpoints waits until the Ready endpoints of the kubernetes
// EndpointSlice are exactly want ("ip:port", any order), within timeout.
func (b *Bed) WaitEndpoints(ctx context.Context, want []string, timeout time.Duration) error {
	want = slices.Clone(want)
	slices.Sort(want)
	return b.waitEndpoints(ctx, timeout, fmt.Sprintf("kubernetes EndpointSlice does not list exactly %v", want),
		func(got []string) bool { return slices.Equal(got, want) })
}

// waitEndpoints polls ReadyEndpoints until ok accepts them.
func (b *Bed) waitEndpoints(ctx context.Context, timeout time.Duration, what string, ok func([]string) bool) error {
	return poll(ctx, timeout, what, func(ctx context.Context) (bool, error) {
		got, err := b.ReadyEndpoints(ctx)
		if err != nil {
			return false, err
		}
		if ok(got) {
			return true, nil
		}
		return false, fmt.Errorf("it lists %v", got)
	})
}
