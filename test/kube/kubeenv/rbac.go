package kubeenv

// The agent's identity: tests run Sluice as deploy/'s ServiceAccount, bound
// to deploy/'s ClusterRole, never as an admin, so that a permission the
// role lacks fails the test that needs it. The apiserver writes an audit
// log of that identity's requests, so that a test can also show the role
// grants nothing the agent does not use.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// AgentUser is the user name the apiserver gives the agent's token.
const AgentUser = "system:serviceaccount:kube-system:sluice"

// auditPolicy logs the agent's requests, at the metadata level (who, what,
// the answer), and nothing else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["` + AgentUser + `"]
- level: None
`

// DeployManifest is the path of deploy/sluice.yaml.
func DeployManifest() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy", "sluice.yaml")
}

// DeployRBAC returns the ServiceAccount, ClusterRole and ClusterRoleBinding
// of deploy/sluice.yaml.
func DeployRBAC() (*corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, error) {
	b, err := os.ReadFile(DeployManifest())
	if err != nil {
		return nil, nil, nil, err
	}
	var sa *corev1.ServiceAccount
	var role *rbacv1.ClusterRole
	var binding *rbacv1.ClusterRoleBinding
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, nil, nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			continue // comments only, or a kind not needed here
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			sa = o
		case *rbacv1.ClusterRole:
			role = o
		case *rbacv1.ClusterRoleBinding:
			binding = o
		}
	}
	if sa == nil || role == nil || binding == nil {
		return nil, nil, nil, fmt.Errorf("%s: want a ServiceAccount, a ClusterRole and a ClusterRoleBinding", DeployManifest())
	}
	return sa, role, binding, nil
}

// setupAgent creates deploy/'s ServiceAccount, ClusterRole and binding,
// and a token for the ServiceAccount: AgentConfig and AgentKubeconfig.
func (e *Env) setupAgent() {
	t := e.t
	t.Helper()
	sa, role, binding, err := DeployRBAC()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// kube-system is created by the apiserver itself, shortly after it is
	// ready: retry while it is missing.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = e.Client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("create the agent's ServiceAccount: %v", err)
	}
	if _, err := e.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the agent's ClusterRole: %v", err)
	}
	if _, err := e.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the agent's ClusterRoleBinding: %v", err)
	}
	tr, err := e.Client.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(6 * 3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for the agent: %v", err)
	}
	e.AgentConfig = rest.AnonymousClientConfig(e.Config)
	e.AgentConfig.BearerToken = tr.Status.Token
	e.AgentKubeconfig = filepath.Join(e.Dir, "agent.kubeconfig")
	WriteKubeconfig(t, e.AgentKubeconfig, e.URL, "sluice", tr.Status.Token)
}

// AuditEvent is one request of the agent, as the apiserver's audit log
// records it.
type AuditEvent struct {
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		APIGroup    string `json:"apiGroup"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Stage string `json:"stage"`
}

// AgentRequests returns the requests the agent's identity made so far, one
// event per request (the stage at which the apiserver answered; a watch
// is logged when it starts).
func (e *Env) AgentRequests() []AuditEvent {
	e.t.Helper()
	b, err := os.ReadFile(filepath.Join(e.Dir, "audit.log"))
	if err != nil {
		e.t.Fatal(err)
	}
	var out []AuditEvent
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for sc.Scan() {
		var ev AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			e.t.Fatalf("audit log: %v: %s", err, sc.Bytes())
		}
		if ev.User.Username != AgentUser || (ev.Stage != "ResponseStarted" && ev.Stage != "ResponseComplete") {
			continue
		}
		if ev.Stage == "ResponseComplete" && ev.Verb == "watch" && ev.ResponseStatus != nil && ev.ResponseStatus.Code == 200 {
			continue // logged once already, when the watch started
		}
		out = append(out, ev)
	}
	return out
}
