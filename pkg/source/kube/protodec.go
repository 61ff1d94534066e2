package kube

import (
	"bytes"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// sliceDecoder decodes an EndpointSlice from the API's protobuf wire
// format straight into what the informer's cache keeps of it
// (cachedSlice, as slimmer.slimSlice makes it of the decoded object),
// without the API object: client-go's EndpointSlice.Unmarshal makes a
// string of every address, node name, zone, label, owner reference and
// managedFields entry, and an Endpoint of 96 bytes for each endpoint,
// which the transform throws away at once (at 30,000 Services x 10
// endpoints, 200 MB of the first sync's 380 and a quarter of its CPU).
//
// It reads what slimSlice reads (the namespace, name, resourceVersion,
// the service-name and headless labels, the annotations, addressType, the ports, and of
// each endpoint its addresses, conditions, node name and hints) and skips
// the rest in place (managedFields, owner references, the other labels,
// targetRef, zone, hostname...), allocating nothing for it. What it does
// not decode as the standard decoder would, it declines (ok false), and
// the caller decodes the object as before: a field of a wire type not its
// own, a message given twice (the standard decoder merges them), an
// addressType other than IPv4 or IPv6, an endpoint without addresses or
// with one not valid for the type (the standard path's validation tells
// which), a malformed length. It does not look inside what it skips: bytes
// the standard decoder would reject there, it accepts (an API server
// sends none).
//
// Not safe for concurrent use: its scratch is reused from one slice to
// the next. It holds sl.mu while it decodes (to share the strings).
type sliceDecoder struct {
	sl *slimmer
	// es is the slice handed to translate.ReadPackedSlice: its metadata,
	// the service-name and headless labels and ports, no endpoints. Its strings are
	// the cache's (never the input's): ReadSlice keeps them.
	es     discoveryv1.EndpointSlice
	labels map[string]string
	ports  []discoveryv1.EndpointPort
	// The values es.Ports point to, in its order.
	portVals []portValue
	eps      []translate.SliceEndpoint
}

func newSliceDecoder(sl *slimmer) *sliceDecoder {
	return &sliceDecoder{sl: sl, labels: map[string]string{}}
}

// k8sMagic starts an object of the API's protobuf encoding: then a
// runtime.Unknown holding the object's type and bytes.
var k8sMagic = []byte("k8s\x00")

// decodeEnvelope is decode of data, an object as the API serves it in
// protobuf (k8sMagic, then a runtime.Unknown), if it is a
// discovery.k8s.io/v1 EndpointSlice of no content encoding.
func (d *sliceDecoder) decodeEnvelope(data []byte) (*cachedSlice, bool) {
	b, ok := bytes.CutPrefix(data, k8sMagic)
	if !ok {
		return nil, false
	}
	var raw []byte
	var typed, hasRaw bool
	ok = eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		if typ != protowire.BytesType {
			return num > 4 // unknown: skipped
		}
		switch num {
		case 1: // typeMeta
			if typed {
				return false
			}
			typed = true
			var apiVersion, kind []byte
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) bool {
				switch {
				case num > 2:
					return true
				case typ != protowire.BytesType:
					return false
				case num == 1:
					apiVersion = v
				default:
					kind = v
				}
				return true
			}) && string(apiVersion) == "discovery.k8s.io/v1" && string(kind) == "EndpointSlice"
		case 2:
			raw, hasRaw = v, true
		case 3: // contentEncoding
			return len(v) == 0
		}
		return true
	})
	if !ok || !typed || !hasRaw {
		return nil, false
	}
	return d.decode(raw)
}

// decode returns what the cache keeps of the EndpointSlice data encodes
// (its protobuf, no envelope), as slimmer.slimSlice makes it of the
// decoded object (its trigger time kept aside in the slimmer), or false
// if it declines data (see sliceDecoder): the caller decodes it then.
func (d *sliceDecoder) decode(data []byte) (*cachedSlice, bool) {
	// addressType (field 4) is written after the endpoints (field 2),
	// whose addresses it says how to read: found first.
	var t []byte
	var typed bool
	if !eachField(data, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		if num == 4 {
			t, typed = v, true
			return typ == protowire.BytesType
		}
		return true
	}) || !typed {
		return nil, false
	}
	var at discoveryv1.AddressType
	switch string(t) {
	case string(discoveryv1.AddressTypeIPv4):
		at = discoveryv1.AddressTypeIPv4
	case string(discoveryv1.AddressTypeIPv6):
		at = discoveryv1.AddressTypeIPv6
	default:
		return nil, false
	}
	sl := d.sl
	sl.mu.Lock()
	defer sl.mu.Unlock()
	es := &d.es
	*es = discoveryv1.EndpointSlice{AddressType: at}
	clear(d.labels)
	d.ports, d.portVals, d.eps = d.ports[:0], d.portVals[:0], d.eps[:0]
	var annotations map[string]string
	var trigger string
	var triggered, meta bool
	if !eachField(data, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		if num > 4 {
			return true
		}
		if typ != protowire.BytesType {
			return false
		}
		switch num {
		case 1:
			if meta {
				return false
			}
			meta = true
			return d.objectMeta(v, &annotations, &trigger, &triggered)
		case 2:
			return d.endpoint(v, at)
		case 3:
			return d.port(v)
		}
		return true
	}) {
		return nil, false
	}
	if len(d.labels) > 0 {
		es.Labels = d.labels
	}
	// es.Ports point into d.portVals, grown to its last size.
	for i := range d.portVals {
		v := &d.portVals[i]
		p := discoveryv1.EndpointPort{}
		if v.has&hasName != 0 {
			p.Name = &v.name
		}
		if v.has&hasProtocol != 0 {
			p.Protocol = &v.protocol
		}
		if v.has&hasPort != 0 {
			p.Port = &v.port
		}
		d.ports = append(d.ports, p)
	}
	es.Ports = d.ports
	c := &cachedSlice{annotations: annotations}
	translate.ReadPackedSlice(&c.Slice, es, d.eps)
	es.Labels = nil
	sl.keepSlice(c, trigger, triggered, false)
	return c, true
}

// objectMeta reads the slice's ObjectMeta: its namespace, name,
// resourceVersion, service-name and headless labels, its trigger time
// (kept aside) and of its annotations only a bookmark's, as slimSlice
// keeps (keptAnnotations).
func (d *sliceDecoder) objectMeta(b []byte, annotations *map[string]string, trigger *string, triggered *bool) bool {
	es := &d.es
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch num {
		case 1, 3, 6, 11, 12:
		default:
			return true // skipped, whatever its type (the standard decoder's check of it is not made)
		}
		if typ != protowire.BytesType {
			return false
		}
		switch num {
		case 1:
			es.Name = string(v)
		case 3:
			es.Namespace = d.sl.shareBytes(v)
		case 6:
			es.ResourceVersion = string(v)
		case 11:
			// The labels translate.SliceLabelsRead names, no other.
			k, val, ok := mapEntry(v)
			if ok {
				switch string(k) {
				case discoveryv1.LabelServiceName:
					d.labels[discoveryv1.LabelServiceName] = string(val)
				case corev1.IsHeadlessService:
					// Read for its presence only (translate.Slice.Headless).
					d.labels[corev1.IsHeadlessService] = ""
				}
			}
			return ok
		case 12:
			k, val, ok := mapEntry(v)
			switch {
			case !ok:
				return false
			case string(k) == corev1.EndpointsLastChangeTriggerTime:
				*trigger, *triggered = string(val), true
			case string(k) == metav1.InitialEventsAnnotationKey:
				// The only one kept (keptAnnotations): a bookmark's.
				*annotations = map[string]string{metav1.InitialEventsAnnotationKey: string(val)}
			}
		}
		return true
	})
}

// mapEntry reads an entry of a map<string, string>: its key (field 1)
// and value (2), empty if absent, the last if given twice.
func mapEntry(b []byte) (k, v []byte, ok bool) {
	ok = eachField(b, func(num protowire.Number, typ protowire.Type, x []byte) bool {
		switch num {
		case 1, 2:
			if typ != protowire.BytesType {
				return false
			}
			if num == 1 {
				k = x
			} else {
				v = x
			}
		}
		return true
	})
	return k, v, ok
}

// endpoint reads an endpoint of a slice of type at into d.eps, as
// ReadPackedSlice takes it; false if it has no address or one not valid
// for at.
func (d *sliceDecoder) endpoint(b []byte, at discoveryv1.AddressType) bool {
	var e translate.SliceEndpoint
	var cond [3]bool // ready, serving, terminating
	var given uint8  // which of cond the endpoint gives
	var conds, hinted bool
	n := 0
	ok := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch num {
		case 1, 2, 6, 8:
		default:
			return true
		}
		if typ != protowire.BytesType {
			return false
		}
		switch num {
		case 1:
			ip, ok := translate.EndpointAddress(at, unsafe.String(unsafe.SliceData(v), len(v)))
			if !ok {
				return false
			}
			if n == 0 {
				e.Addr = ip
			}
			n++
		case 2:
			if conds {
				return false
			}
			conds = true
			return conditions(v, &cond, &given)
		case 6:
			e.NodeName = d.sl.shareBytesPtr(v)
		case 8:
			if hinted {
				return false
			}
			hinted = true
			h, ok := hints(v)
			e.Hints = h
			return ok
		}
		return true
	})
	if !ok || n == 0 {
		return false
	}
	// The API's defaults for what the endpoint does not give.
	var c discoveryv1.EndpointConditions
	if given&1 != 0 {
		c.Ready = &cond[0]
	}
	if given&2 != 0 {
		c.Serving = &cond[1]
	}
	if given&4 != 0 {
		c.Terminating = &cond[2]
	}
	e.Ready, e.Serving, e.Terminating = translate.EndpointConditions(&c)
	d.eps = append(d.eps, e)
	return true
}

// conditions reads an endpoint's conditions (ready, serving,
// terminating) into cond, setting in given the bit of each given.
func conditions(b []byte, cond *[3]bool, given *uint8) bool {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		if num > 3 {
			return true
		}
		if typ != protowire.VarintType {
			return false
		}
		x, n := protowire.ConsumeVarint(v)
		if n < 0 {
			return false
		}
		cond[num-1] = x != 0
		*given |= 1 << (num - 1)
		return true
	})
}

// hints reads an endpoint's hints, which the cache keeps as the API's.
func hints(b []byte) (*discoveryv1.EndpointHints, bool) {
	h := &discoveryv1.EndpointHints{}
	ok := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		if num > 2 {
			return true
		}
		if typ != protowire.BytesType {
			return false
		}
		var name string
		if !eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) bool {
			if num != 1 {
				return true
			}
			name = string(v)
			return typ == protowire.BytesType
		}) {
			return false
		}
		if num == 1 {
			h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: name})
		} else {
			h.ForNodes = append(h.ForNodes, discoveryv1.ForNode{Name: name})
		}
		return true
	})
	return h, ok
}

// portValue is what a slice's port says, read by port.
type portValue struct {
	name     string
	protocol corev1.Protocol
	port     int32
	has      uint8 // hasName, hasProtocol, hasPort: which of them it gives
}

const (
	hasName = 1 << iota
	hasProtocol
	hasPort
)

// port reads a port of the slice into d.portVals.
func (d *sliceDecoder) port(b []byte) bool {
	var pv portValue
	ok := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch num {
		case 1, 2:
			if typ != protowire.BytesType {
				return false
			}
			if num == 1 {
				pv.name = d.sl.shareBytes(v)
				pv.has |= hasName
				return true
			}
			switch string(v) {
			case string(corev1.ProtocolTCP):
				pv.protocol = corev1.ProtocolTCP
			case string(corev1.ProtocolUDP):
				pv.protocol = corev1.ProtocolUDP
			case string(corev1.ProtocolSCTP):
				pv.protocol = corev1.ProtocolSCTP
			default:
				pv.protocol = corev1.Protocol(v)
			}
			pv.has |= hasProtocol
		case 3:
			if typ != protowire.VarintType {
				return false
			}
			x, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return false
			}
			pv.port = int32(x) //nolint:gosec // truncated as the standard decoder does
			pv.has |= hasPort
		case 4:
			return typ == protowire.BytesType
		}
		return true
	})
	if ok {
		d.portVals = append(d.portVals, pv)
	}
	return ok
}

// eachField calls f with each field of the message b: its number, wire type
// and value (a varint's or fixed's bytes, a length-delimited field's
// contents, a group's whole); false, at once, if b is malformed or f says
// so.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n >= 0 {
				v = b[:n]
			}
		}
		if n < 0 || !f(num, typ, v) {
			return false
		}
		b = b[n:]
	}
	return true
}

// shareBytes is shareValue of b's string, allocating it only if it is
// not shared yet. Called with mu held.
func (sl *slimmer) shareBytes(b []byte) string {
	if p, ok := sl.strings[string(b)]; ok {
		return *p
	}
	if len(b) == 0 {
		return ""
	}
	return *sl.add(string(b))
}

// shareBytesPtr is share of b's string: the shared pointer to it, the
// string allocated only if it is not shared yet (looked up once). Called
// with mu held.
func (sl *slimmer) shareBytesPtr(b []byte) *string {
	if p, ok := sl.strings[string(b)]; ok {
		return p
	}
	return sl.add(string(b))
}
