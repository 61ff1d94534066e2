// Package kubeenv starts a real etcd and kube-apiserver on loopback for a
// test, and tears them down with t.Cleanup, even when the test fails. A
// command (the control-plane benchmark) runs them the same way through Run,
// which gives it a TB outside a test.
//
// The binaries are the pinned ones test/kube/tools builds (kube-apiserver
// v1.36.3 and etcd v3.6.8, the version that kube-apiserver pins), cached by
// version under $XDG_CACHE_HOME/sluice (or ~/.cache/sluice): the first run on
// a fresh machine builds them, which takes minutes; later runs start in
// about three seconds. SLUICE_KUBE_BIN names a directory that holds them
// instead.
//
// There is no kubelet, no controller manager and no scheduler: tests create
// the objects those would (a Node and its addresses, EndpointSlices) by
// hand. The tests' own clients authenticate with a static token in
// system:masters; the agent's with a token of deploy/'s ServiceAccount,
// bound to deploy/'s ClusterRole (rbac.go), whose requests the apiserver
// writes to an audit log.
package kubeenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// AdvertiseAddress is what the apiserver advertises for the default/kubernetes
// Service: it rejects loopback, so this is an address from TEST-NET-1
// (RFC 5737) that exists nowhere. Nothing is ever sent to it.
const AdvertiseAddress = "192.0.2.1"

// ServiceCIDR is the range ClusterIPs are allocated from, ServiceCIDR6 the
// IPv6 one beside it: the cluster is dual stack with IPv4 primary, so a
// Service gets an IPv4 ClusterIP unless its ipFamilyPolicy or ipFamilies
// ask for IPv6 (a /112: the apiserver has long refused IPv6 ranges wider
// than /108).
const (
	ServiceCIDR  = "10.96.0.0/16"
	ServiceCIDR6 = "2001:db8:96::/112"
)

// Env is one etcd plus one kube-apiserver.
type Env struct {
	// Client talks to the apiserver as a cluster admin.
	Client kubernetes.Interface
	// Config is the rest config behind Client.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file for the same identity.
	Kubeconfig string
	// AgentConfig and AgentKubeconfig authenticate as the agent does in a
	// cluster: deploy/'s ServiceAccount, with deploy/'s ClusterRole.
	AgentConfig     *rest.Config
	AgentKubeconfig string
	// URL is the apiserver's https address.
	URL string
	// Dir holds the data, certificates and logs; it is removed at cleanup.
	Dir string
	// EtcdURL is etcd's client address (reached through Options.Dial when
	// the control plane runs in a namespace); see Store.
	EtcdURL string

	t         TB
	bin       string
	token     string
	apiArgs   []string
	mu        sync.Mutex
	etcd, api *proc
	apiStarts int
	extras    []*proc
	opts      Options

	etcdClientOnce sync.Once
	etcdClient     *http.Client
}

// proc is a child process and the channel that closes when it exits.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  string
}

// BinDir returns the directory holding kube-apiserver and etcd, building
// them first if they are missing.
func BinDir(t TB) string {
	t.Helper()
	dir, err := builtBinaries()
	if err != nil {
		t.Fatalf("kube binaries: %v", err)
	}
	return dir
}

// builtBinaries builds (or finds) the binaries once per test binary.
var builtBinaries = sync.OnceValues(buildBinaries)

func buildBinaries() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate kubeenv source")
	}
	script := filepath.Join(filepath.Dir(file), "..", "tools", "build.sh")
	cmd := exec.Command("bash", script)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w\n%s", script, err, errb.String())
	}
	if d := time.Since(start); d > 5*time.Second {
		fmt.Fprintf(os.Stderr, "kubeenv: built kube binaries in %v\n%s", d.Round(time.Second), errb.String())
	}
	return strings.TrimSpace(out.String()), nil
}

// Options change where the control plane runs.
type Options struct {
	// NetNS, if set, is the path of a network namespace (/run/netns/NAME)
	// to run etcd and the apiserver in, through nsenter: their loopback is
	// then that namespace's, so an agent in the same namespace reaches the
	// apiserver at 127.0.0.1 without any route to the host.
	NetNS string
	// Dial connects from inside NetNS; the Env's own clients use it.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// APIServerArgs are added to kube-apiserver's command line, for
	// example to turn a feature gate off.
	APIServerArgs []string
}

// Start starts etcd and kube-apiserver and waits until the apiserver is
// ready. Everything is stopped and removed when the test ends.
func Start(t TB) *Env { t.Helper(); return StartWith(t, Options{}) }

// StartWith is Start with options.
func StartWith(t TB, o Options) *Env {
	t.Helper()
	if (o.NetNS == "") != (o.Dial == nil) {
		t.Fatal("kubeenv: NetNS and Dial go together")
	}
	bin := BinDir(t)
	dir, err := os.MkdirTemp("", "kubeenv-")
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{t: t, bin: bin, Dir: dir, opts: o}
	t.Cleanup(e.cleanup)

	ports := testutil.FreePorts(t, 3)
	etcdClient := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	etcdPeer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	e.etcd = e.start("etcd", filepath.Join(bin, "etcd"),
		"--name=kubeenv",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdClient,
		"--advertise-client-urls="+etcdClient,
		"--listen-peer-urls="+etcdPeer,
		"--initial-advertise-peer-urls="+etcdPeer,
		"--initial-cluster=kubeenv="+etcdPeer,
		"--log-level=warn",
		"--unsafe-no-fsync", // test data: durability across power loss is moot
	)
	e.waitHTTP(e.etcd, etcdClient+"/health", nil, 30*time.Second)
	e.EtcdURL = etcdClient

	tokenBytes := make([]byte, 16)
	rand.Read(tokenBytes)
	e.token = hex.EncodeToString(tokenBytes)
	tokenFile := filepath.Join(dir, "tokens.csv")
	writeFile(t, tokenFile, []byte(e.token+`,admin,admin,"system:masters"`+"\n"))
	saKey := filepath.Join(dir, "sa.key")
	writeFile(t, saKey, rsaKeyPEM(t))
	auditPolicyFile := filepath.Join(dir, "audit-policy.yaml")
	writeFile(t, auditPolicyFile, []byte(auditPolicy))

	e.URL = fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	e.apiArgs = []string{
		"--etcd-servers=" + etcdClient,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", ports[2]),
		"--advertise-address=" + AdvertiseAddress,
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=" + ServiceCIDR + "," + ServiceCIDR6,
		"--enable-priority-and-fairness=false",
		// The endpoints of default/kubernetes stay empty: a stopping
		// apiserver would otherwise remove its own endpoint and a
		// starting one put it back, changing the state under tests that
		// restart it.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		"--audit-policy-file=" + auditPolicyFile,
		"--audit-log-path=" + filepath.Join(dir, "audit.log"),
		"--v=0",
	}
	e.apiArgs = append(e.apiArgs, o.APIServerArgs...)
	e.StartAPIServer()

	e.Config = &rest.Config{
		Host:            e.URL,
		BearerToken:     e.token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             1000,
		Burst:           1000,
		Dial:            o.Dial,
	}
	if e.Client, err = kubernetes.NewForConfig(e.Config); err != nil {
		t.Fatal(err)
	}
	e.Kubeconfig = filepath.Join(dir, "kubeconfig")
	WriteKubeconfig(t, e.Kubeconfig, e.URL, "admin", e.token)
	e.setupAgent()
	return e
}

// StartAPIServer starts the apiserver (again, after StopAPIServer) on the
// same port and data, and waits until it is ready.
func (e *Env) StartAPIServer() {
	e.t.Helper()
	e.mu.Lock()
	if e.api != nil {
		e.mu.Unlock()
		e.t.Fatal("apiserver already running")
	}
	e.apiStarts++
	api := e.start(fmt.Sprintf("kube-apiserver.%d", e.apiStarts), filepath.Join(e.bin, "kube-apiserver"), e.apiArgs...)
	e.api = api
	e.mu.Unlock()
	start := time.Now()
	e.waitHTTP(api, e.URL+"/readyz", http.Header{"Authorization": {"Bearer " + e.token}}, 60*time.Second)
	e.t.Logf("kube-apiserver ready in %v", time.Since(start).Round(10*time.Millisecond))
}

// StopAPIServer stops the apiserver, leaving etcd and its data: clients see
// an API outage.
func (e *Env) StopAPIServer() {
	e.t.Helper()
	e.mu.Lock()
	api := e.api
	e.api = nil
	e.mu.Unlock()
	if api == nil {
		e.t.Fatal("apiserver not running")
	}
	if err := api.stop(); err != nil {
		e.t.Fatal(err)
	}
}

// StartExtraAPIServer starts a second kube-apiserver over the same etcd, as
// in a highly available control plane, and returns a client for it. It runs
// until the test ends. Tests use it to change objects while the first
// apiserver, the one the proxy watches, is down.
func (e *Env) StartExtraAPIServer() kubernetes.Interface {
	e.t.Helper()
	port := testutil.FreePorts(e.t, 1)[0]
	args := make([]string, 0, len(e.apiArgs))
	for _, a := range e.apiArgs {
		switch {
		case strings.HasPrefix(a, "--secure-port="):
			a = fmt.Sprintf("--secure-port=%d", port)
		case strings.HasPrefix(a, "--cert-dir="):
			a = "--cert-dir=" + filepath.Join(e.Dir, fmt.Sprintf("certs-extra-%d", port))
		case strings.HasPrefix(a, "--audit-log-path="):
			a = "--audit-log-path=" + filepath.Join(e.Dir, fmt.Sprintf("audit-extra-%d.log", port))
		}
		args = append(args, a)
	}
	p := e.start(fmt.Sprintf("kube-apiserver-extra-%d", port), filepath.Join(e.bin, "kube-apiserver"), args...)
	e.mu.Lock()
	e.extras = append(e.extras, p)
	e.mu.Unlock()
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	e.waitHTTP(p, url+"/readyz", http.Header{"Authorization": {"Bearer " + e.token}}, 60*time.Second)
	cfg := rest.CopyConfig(e.Config)
	cfg.Host = url
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// CreateNode creates a Node with an InternalIP, as a kubelet would, and
// returns it.
func (e *Env) CreateNode(ctx context.Context, name, internalIP string) *corev1.Node {
	e.t.Helper()
	n, err := e.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create node %s: %v", name, err)
	}
	n.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: internalIP},
		{Type: corev1.NodeHostName, Address: name},
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}}
	n, err = e.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatalf("set node %s addresses: %v", name, err)
	}
	return n
}

// start runs a binary with a scrubbed environment, its output in a log file
// under Dir, in its own process group, killed if the test binary dies.
func (e *Env) start(name, path string, args ...string) *proc {
	e.t.Helper()
	logPath := filepath.Join(e.Dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		e.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	if e.opts.NetNS != "" {
		// nsenter execs the binary: the pid, process group and death
		// signal stay those of the control plane process.
		cmd = exec.Command("nsenter", append([]string{"--net=" + e.opts.NetNS, "--", path}, args...)...)
	}
	cmd.Dir = e.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = scrubbedEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p
}

// scrubbedEnv is the environment without variables that the children read as
// configuration: etcd treats every ETCD_* variable as a flag and refuses to
// start when one conflicts with a command-line flag.
func scrubbedEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "ETCD_") || strings.HasPrefix(k, "ETCDCTL_") || k == "KUBECONFIG" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// stop terminates the process group, politely first. A group that is
// already gone (ESRCH) is stopped; any other failure to signal it is an
// error, returned rather than waited on for ever.
func (p *proc) stop() error {
	if p.exited() {
		return nil
	}
	if err := p.signal(syscall.SIGTERM, "stop"); err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		if err := p.signal(syscall.SIGKILL, "kill"); err != nil {
			return err
		}
		<-p.done
	}
	return nil
}

// signal sends sig to the process group; verb names the attempt in the
// error.
func (p *proc) signal(sig syscall.Signal, verb string) error {
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("%s %s: %w", verb, p.name, err)
	}
	return nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (e *Env) cleanup() {
	e.mu.Lock()
	api, etcd, extras := e.api, e.etcd, e.extras
	e.api, e.extras = nil, nil
	e.mu.Unlock()
	// The apiservers first: etcd must outlive its clients.
	for _, p := range append([]*proc{api}, extras...) {
		if p != nil {
			if err := p.stop(); err != nil {
				e.t.Error(err)
			}
		}
	}
	if etcd != nil {
		if err := etcd.stop(); err != nil {
			e.t.Error(err)
		}
	}
	if e.t.Failed() {
		for _, name := range []string{"etcd.log", fmt.Sprintf("kube-apiserver.%d.log", e.apiStarts)} {
			e.t.Logf("--- tail of %s ---\n%s", name, tail(filepath.Join(e.Dir, name), 40))
		}
	}
	if err := os.RemoveAll(e.Dir); err != nil {
		e.t.Errorf("remove the apiserver's and etcd's data: %v", err)
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitHTTP polls url until it answers 200, the process exits, or timeout.
func (e *Env) waitHTTP(p *proc, url string, h http.Header, timeout time.Duration) {
	t := e.t
	t.Helper()
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DialContext: e.opts.Dial}}
	defer client.CloseIdleConnections()
	exited := false
	err := testutil.Poll(timeout, func() error {
		if exited = p.exited(); exited {
			return nil // no use waiting any longer
		}
		req, _ := http.NewRequest("GET", url, nil)
		req.Header = h
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
	if exited {
		t.Fatalf("%s exited: %v\n%s", p.name, p.err, tail(p.log, 40))
	}
	if err != nil {
		t.Fatalf("%s not ready at %s after %v (last: %v)\n%s", p.name, url, timeout, err, tail(p.log, 40))
	}
}

func rsaKeyPEM(t TB) []byte {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
}

// WriteKubeconfig writes a kubeconfig for the apiserver at server as user,
// authenticated by token.
func WriteKubeconfig(t TB, path, server, user, token string) {
	t.Helper()
	writeFile(t, path, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubeenv
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: %s
  user:
    token: %s
contexts:
- name: kubeenv
  context: {cluster: kubeenv, user: %s}
current-context: kubeenv
`, server, user, token, user)))
}

func writeFile(t TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Discovery returns a discovery client for cfg.
func Discovery(t TB, cfg *rest.Config) discovery.DiscoveryInterface {
	t.Helper()
	return Clientset(t, cfg).Discovery()
}

// Clientset returns a typed client for cfg.
func Clientset(t TB, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
