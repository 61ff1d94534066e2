package metrics

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// earlyHost is the host of a request made before any test, so before any
// Metrics exists; earlyErr, what went wrong making it.
var earlyHost, earlyErr = "", error(nil)

func TestMain(m *testing.M) {
	earlyHost, earlyErr = requestVersion()
	os.Exit(m.Run())
}

// requestVersion makes one request through client-go, as the Kubernetes
// source makes them, and returns the host it went to.
func requestVersion() (string, error) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"36"}`))
	}))
	defer api.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		return "", err
	}
	if _, err := client.Discovery().ServerVersion(); err != nil {
		return "", fmt.Errorf("request: %w", err)
	}
	return strings.TrimPrefix(api.URL, "http://"), nil
}

// client-go's requests are counted from the process's start, as
// component-base's hooks count them in kube-proxy: the agent's first ones
// (the Node read for --node-ip, NodeCIDR's wait) come before its metrics
// are set up.
func TestRESTClientCountedBeforeNew(t *testing.T) {
	if earlyErr != nil {
		t.Fatal(earlyErr)
	}
	got := scrape(t, New())
	for s, want := range map[string]float64{
		`rest_client_requests_total{code="200",host="` + earlyHost + `",method="GET"}`:    1,
		`rest_client_request_duration_seconds_count{host="` + earlyHost + `",verb="GET"}`: 1,
	} {
		if v, ok := got[s]; !ok || v != want {
			t.Errorf("%s = %v (exported: %v), want %v", s, v, ok, want)
		}
	}
}
