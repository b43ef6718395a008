package testbed

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// localProxyRBAC is what cmd/localproxy needs: watch the kubernetes
// EndpointSlice, get core endpoints as the fallback, and get nodes for
// the zone label of its own (as the chart's ClusterRole grants).
func localProxyRBAC() (*corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding) {
	labels := map[string]string{"app.kubernetes.io/name": localProxyName}
	sa := &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: localProxyName, Namespace: localProxyNS, Labels: labels},
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: localProxyName, Labels: labels},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"endpoints"}, Verbs: []string{"get"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: localProxyName, Labels: labels},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: localProxyName},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: localProxyName, Namespace: localProxyNS}},
	}
	return sa, role, binding
}

// applyRBAC creates the localproxy objects (existing ones are kept).
func applyRBAC(ctx context.Context, cs kubernetes.Interface, timeout time.Duration) error {
	sa, role, binding := localProxyRBAC()
	create := func(ctx context.Context) error {
		if _, err := cs.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("serviceaccount %s/%s: %w", sa.Namespace, sa.Name, err)
		}
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("clusterrole %s: %w", role.Name, err)
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("clusterrolebinding %s: %w", binding.Name, err)
		}
		return nil
	}
	// The kube-system namespace is created by a post-start hook; retry
	// until it exists.
	return poll(ctx, timeout, "localproxy RBAC not applied", func(ctx context.Context) (bool, error) {
		err := create(ctx)
		return err == nil, err
	})
}
