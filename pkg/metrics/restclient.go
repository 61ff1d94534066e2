package metrics

// client-go's request metrics, as kube-proxy exports them: client-go
// reports every request to the API server through the hooks of
// k8s.io/client-go/tools/metrics, which do nothing until a program
// registers an implementation. kube-proxy registers component-base's
// (k8s.io/component-base/metrics/prometheus/restclient); this is the part
// of it that a node proxy's dashboards use, under the same names, labels
// and buckets, over prometheus/client_golang directly: component-base
// would bring its own registry layer, OpenTelemetry and a dozen modules
// for four series.
//
//	rest_client_requests_total{code,method,host}            counter, every answer (code "<error>" without one)
//	rest_client_request_duration_seconds{verb,host}         histogram, every request
//	rest_client_rate_limiter_duration_seconds{verb,host}    histogram, time waited for the client's rate limiter (--kube-api-qps)
//	rest_client_request_retries_total{code,verb,host}       counter, retries
//
// Left out: the request and response sizes, DNS resolution, exec plugins
// and the transport cache's (component-base's registry has the latter few;
// no Sluice dashboard or alert reads them).
//
// client-go's hooks are global and taken once (metrics.Register), so the
// collectors are the process's: every Metrics registers the same ones. The
// hooks are set at init, as component-base sets its own: every request the
// process makes is counted, those before the first New too, and the hooks'
// globals, which client-go reads without a lock, are written before any
// goroutine could be making a request.

import (
	"context"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// restClientLatencyBuckets are component-base's request latency buckets.
var restClientLatencyBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0}

var (
	restRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_requests_total",
		Help: "Number of HTTP requests, partitioned by status code, method, and host.",
	}, []string{"code", "method", "host"})
	restLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rest_client_request_duration_seconds",
		Help:    "Request latency in seconds. Broken down by verb, and host.",
		Buckets: restClientLatencyBuckets,
	}, []string{"verb", "host"})
	restRateLimiter = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rest_client_rate_limiter_duration_seconds",
		Help:    "Client side rate limiter latency in seconds. Broken down by verb, and host.",
		Buckets: restClientLatencyBuckets,
	}, []string{"verb", "host"})
	restRetries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_request_retries_total",
		Help: "Number of request retries, partitioned by status code, verb, and host.",
	}, []string{"code", "verb", "host"})
)

func init() {
	clientmetrics.Register(clientmetrics.RegisterOpts{
		RequestResult:      restResult{},
		RequestLatency:     restLatencyHook{restLatency},
		RateLimiterLatency: restLatencyHook{restRateLimiter},
		RequestRetry:       restRetry{},
	})
}

// registerRESTClient registers client-go's request metrics in reg (client-go
// reports to them from init on).
func registerRESTClient(reg prometheus.Registerer) {
	reg.MustRegister(restRequests, restLatency, restRateLimiter, restRetries)
}

type restResult struct{}

func (restResult) Increment(_ context.Context, code, method, host string) {
	restRequests.WithLabelValues(code, method, host).Inc()
}

type restRetry struct{}

func (restRetry) IncrementRetry(_ context.Context, code, method, host string) {
	restRetries.WithLabelValues(code, method, host).Inc()
}

// restLatencyHook labels a latency with the URL's host, as component-base
// does (the path would make a series per object).
type restLatencyHook struct{ h *prometheus.HistogramVec }

func (l restLatencyHook) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	l.h.WithLabelValues(verb, u.Host).Observe(latency.Seconds())
}
