package kubeenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
)

// Store writes obj under key in etcd as the apiserver stores it (its
// storage version, protobuf, no resourceVersion), bypassing the
// apiserver: what a benchmark does to create tens of thousands of objects
// in seconds where the apiserver takes most of an hour (each Service's
// ClusterIP allocation counts every allocated address twice: quadratic).
// The apiserver's watch on etcd picks the object up as if it had written
// it. The caller makes obj whole (everything the apiserver's create would
// set: uid, creationTimestamp, managedFields, defaults, and any object an
// allocation would have made beside it), best by copying one the
// apiserver created; key is the apiserver's, as StorageKey spells it.
// It returns etcd's revision after the write: the resourceVersion the
// apiserver will give the object.
func (e *Env) Store(ctx context.Context, key string, obj runtime.Object, gvk schema.GroupVersionKind) (int64, error) {
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	if m, ok := obj.(interface{ SetResourceVersion(string) }); ok {
		m.SetResourceVersion("")
	}
	var val bytes.Buffer
	if err := storeSerializer.Encode(obj, &val); err != nil {
		return 0, fmt.Errorf("encode %s: %w", key, err)
	}
	// etcd's JSON gateway (/v3/kv/put): keys and values base64 in JSON,
	// which encoding/json does for []byte.
	body, err := json.Marshal(struct {
		Key   []byte `json:"key"`
		Value []byte `json:"value"`
	}{[]byte(key), val.Bytes()})
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.EtcdURL+"/v3/kv/put", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := e.etcdHTTP().Do(req)
	if err != nil {
		return 0, fmt.Errorf("put %s in etcd: %w", key, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("put %s in etcd: %s: %s", key, resp.Status, b)
	}
	// The gateway spells int64s as JSON strings.
	var put struct {
		Header struct {
			Revision int64 `json:"revision,string"`
		} `json:"header"`
	}
	if err := json.Unmarshal(b, &put); err != nil || put.Header.Revision == 0 {
		return 0, fmt.Errorf("put %s in etcd: no revision in %q (%v)", key, b, err)
	}
	return put.Header.Revision, nil
}

// StorageKey is where the apiserver keeps an object of resource (plural,
// lower case) in etcd, under its default prefix: namespace is "" for a
// cluster-scoped one. Services are the exception the apiserver makes
// ("services/specs"); pass resource as the apiserver's registry names it.
func StorageKey(resource, namespace, name string) string {
	if namespace == "" {
		return "/registry/" + resource + "/" + name
	}
	return "/registry/" + resource + "/" + namespace + "/" + name
}

// storeSerializer encodes objects as the apiserver's etcd3 storage does by
// default (application/vnd.kubernetes.protobuf: the "k8s\x00" magic and a
// runtime.Unknown holding the object's kind and bytes).
var storeSerializer = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)

// etcdHTTP is the client Store talks to etcd with, through the control
// plane's namespace if it has one; made once.
func (e *Env) etcdHTTP() *http.Client {
	e.etcdClientOnce.Do(func() {
		e.etcdClient = &http.Client{Transport: &http.Transport{DialContext: e.opts.Dial, MaxIdleConnsPerHost: 64}}
	})
	return e.etcdClient
}
