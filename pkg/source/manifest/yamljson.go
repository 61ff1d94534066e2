package manifest

// A faster YAML-to-JSON conversion for the YAML kubectl and most
// generators write.
//
// sigs.k8s.io/yaml's YAMLToJSON parses a document into generic Go values
// (go-yaml v2, YAML 1.1) and marshals them: it made a stream of YAML
// documents 7x slower to load than the same objects as a JSON List.
// blockYAMLToJSON converts, in one pass, the plain subset such files are
// written in: block mappings and sequences (a sequence may sit at its
// key's indentation), plain and single- or double-quoted scalars on one
// line, comments, and one-line flow collections of those ({name: a},
// [10.0.0.1]). It declines (ok false) anything else, and anything it is
// not sure go-yaml reads the same way, for the caller to convert the
// document with YAMLToJSON as before: anchors, tags, block and
// multi-line scalars, flow collections over several lines, tabs,
// non-ASCII bytes, quoted keys, escapes, a key twice, and every plain
// scalar YAML 1.1 could read as something other than a string (yes, on,
// ~, 0x1F, 012, 1_000, 1.5, .inf, +1, -1, a timestamp, ...) except a
// plain decimal integer, true, false and null. Its JSON is YAMLToJSON's
// but for white space and escapes (json.Marshal writes < as \u003c):
// the same keys, in the same (sorted) order, the same values. So
// encoding/json decodes the two alike, errors included.

import (
	"bytes"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// yamlLine is a line of a YAML document that holds something.
type yamlLine struct {
	indent int
	text   []byte // after the indentation, comments not removed
}

type yamlConv struct {
	lines []yamlLine
	pos   int
	out   []byte
	// for sortMembers
	tmp    []byte
	sorted []member
}

// member is where a member of an object is in yamlConv.out.
type member struct {
	key        []byte
	start, end int // "key":value
}

// addKey starts a member of the object whose members so far are ms.
func (c *yamlConv) addKey(ms []member, key []byte) ([]member, bool) {
	for _, m := range ms {
		if bytes.Equal(m.key, key) {
			return nil, false // go-yaml keeps the last; not worth the care
		}
	}
	if len(ms) > 0 {
		c.out = append(c.out, ',')
	}
	ms = append(ms, member{key: key, start: len(c.out)})
	c.out = append(c.out, '"')
	c.out = append(c.out, key...)
	c.out = append(c.out, '"', ':')
	return ms, true
}

// sortMembers puts the members of an object (their ends set) in the
// order of their keys, as json.Marshal writes a map.
func (c *yamlConv) sortMembers(ms []member) {
	if slices.IsSortedFunc(ms, func(a, b member) int { return bytes.Compare(a.key, b.key) }) {
		return
	}
	from, to := ms[0].start, ms[len(ms)-1].end
	c.tmp = append(c.tmp[:0], c.out[from:to]...)
	c.sorted = append(c.sorted[:0], ms...)
	slices.SortFunc(c.sorted, func(a, b member) int { return bytes.Compare(a.key, b.key) })
	out := c.out[:from]
	for i, m := range c.sorted {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, c.tmp[m.start-from:m.end-from]...)
	}
	c.out = out
}

// blockYAMLToJSON converts doc. ok is false if it declines (see above).
func blockYAMLToJSON(doc []byte) (js []byte, ok bool) {
	var c yamlConv
	return c.convert(doc)
}

// convert is blockYAMLToJSON reusing c's memory: js is valid until the
// next call.
func (c *yamlConv) convert(doc []byte) (js []byte, ok bool) {
	c.lines, c.pos, c.out = c.lines[:0], 0, c.out[:0]
	for line := range bytes.Lines(doc) {
		line = bytes.TrimSuffix(line, []byte("\n"))
		n := 0
		for n < len(line) && line[n] == ' ' {
			n++
		}
		for _, b := range line {
			if b < 0x20 || b >= 0x7f {
				return nil, false // tabs, CR, non-ASCII
			}
		}
		t := line[n:]
		if len(t) == 0 || t[0] == '#' {
			continue
		}
		if n == 0 && (t[0] == '%' || bytes.HasPrefix(t, []byte("---")) || bytes.HasPrefix(t, []byte("..."))) {
			return nil, false
		}
		c.lines = append(c.lines, yamlLine{n, t})
	}
	if len(c.lines) == 0 || c.lines[0].indent != 0 || isSeqItem(c.lines[0].text) {
		return nil, false // a mapping at the top, or declined
	}
	if !c.mapping(0) || c.pos != len(c.lines) {
		return nil, false
	}
	return c.out, true
}

func isSeqItem(t []byte) bool { return len(t) > 0 && t[0] == '-' && (len(t) == 1 || t[1] == ' ') }

// node converts the block at line c.pos, more indented than parent.
func (c *yamlConv) node(parent int) bool {
	l := c.lines[c.pos]
	if l.indent <= parent {
		return false
	}
	if isSeqItem(l.text) {
		return c.sequence(l.indent)
	}
	return c.mapping(l.indent)
}

// mapping converts the mapping whose keys are at indent.
func (c *yamlConv) mapping(indent int) bool {
	c.out = append(c.out, '{')
	var buf [16]member
	ms := buf[:0]
	for c.pos < len(c.lines) {
		l := c.lines[c.pos]
		if l.indent < indent || l.indent == indent && isSeqItem(l.text) {
			break
		}
		if l.indent > indent {
			return false
		}
		key, rest, ok := splitKey(l.text)
		if !ok {
			return false
		}
		rest = bytes.TrimLeft(rest, " ")
		if ms, ok = c.addKey(ms, key); !ok {
			return false
		}
		c.pos++
		if !c.value(indent, rest, true) {
			return false
		}
		ms[len(ms)-1].end = len(c.out)
	}
	if len(ms) == 0 {
		return false
	}
	c.sortMembers(ms)
	c.out = append(c.out, '}')
	return true
}

// value converts what follows a key (in a mapping at indent) or a "- "
// (in a sequence at indent): rest of the line, or the block below it.
func (c *yamlConv) value(indent int, rest []byte, inMapping bool) bool {
	if len(rest) > 0 && rest[0] == '#' {
		rest = nil
	}
	rest = stripComment(rest)
	if len(rest) > 0 {
		if c.pos < len(c.lines) && c.lines[c.pos].indent > indent {
			return false // a scalar continued on the next line
		}
		return c.scalar(rest)
	}
	if c.pos < len(c.lines) {
		next := c.lines[c.pos]
		if next.indent > indent || inMapping && next.indent == indent && isSeqItem(next.text) {
			if next.indent == indent {
				return c.sequence(indent)
			}
			return c.node(indent)
		}
	}
	c.out = append(c.out, "null"...)
	return true
}

// sequence converts the sequence whose "- " are at indent.
func (c *yamlConv) sequence(indent int) bool {
	c.out = append(c.out, '[')
	n := 0
	for c.pos < len(c.lines) {
		l := c.lines[c.pos]
		if l.indent != indent || !isSeqItem(l.text) {
			if l.indent > indent {
				return false
			}
			break
		}
		if n > 0 {
			c.out = append(c.out, ',')
		}
		n++
		item := l.text[1:]
		off := 1
		for len(item) > 0 && item[0] == ' ' {
			item, off = item[1:], off+1
		}
		switch _, _, isMap := splitKey(item); {
		case len(item) == 0 || item[0] == '#':
			c.pos++
			if !c.value(indent, nil, false) {
				return false
			}
		case isMap:
			// A mapping that starts on the item's line: its keys are
			// at the column of the first.
			c.lines[c.pos] = yamlLine{indent + off, item}
			if !c.mapping(indent + off) {
				return false
			}
		case isSeqItem(item):
			return false
		default:
			c.pos++
			if !c.value(indent, item, false) {
				return false
			}
		}
	}
	c.out = append(c.out, ']')
	return true
}

// maxPlainKey is the longest plain key splitKey takes: go-yaml refuses an
// implicit key of more than 1,024 characters ("mapping values are not
// allowed in this context"); longer ones, with some margin, go to the old
// path, which gives its error.
const maxPlainKey = 1000

// splitKey splits "key: rest" or "key:" with a plain key that is a string
// to YAML 1.1 (letters, digits, and . / - _, starting with a letter, and
// not a boolean or null word) of at most maxPlainKey bytes.
func splitKey(t []byte) (key, rest []byte, ok bool) {
	i := 0
	for i < len(t) && (isAlnum(t[i]) || i > 0 && (t[i] == '.' || t[i] == '/' || t[i] == '-' || t[i] == '_')) {
		i++
	}
	if i == 0 || i > maxPlainKey || !isLetter(t[0]) || i == len(t) || t[i] != ':' || i+1 < len(t) && t[i+1] != ' ' {
		return nil, nil, false
	}
	if yaml11Word(t[:i]) {
		return nil, nil, false
	}
	return t[:i], t[i+1:], true
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func isAlnum(c byte) bool { return isLetter(c) || '0' <= c && c <= '9' }

// yaml11Word reports whether go-yaml v2 reads the plain scalar w as
// something other than a string (in any case, to be safe).
func yaml11Word(w []byte) bool {
	if len(w) > 5 {
		return false
	}
	for _, word := range [...]string{"y", "n", "yes", "no", "on", "off", "true", "false", "null"} {
		if asciiEqualFold(w, word) {
			return true
		}
	}
	return false
}

// stripComment removes a comment (" #...") and trailing spaces.
func stripComment(t []byte) []byte {
	inQuote := byte(0)
	for i, b := range t {
		switch {
		case inQuote != 0:
			if b == inQuote {
				inQuote = 0
			}
		case (b == '"' || b == '\'') && i == 0:
			inQuote = b
		case b == '#' && i > 0 && t[i-1] == ' ':
			t = t[:i]
			return bytes.TrimRight(t, " ")
		}
	}
	return bytes.TrimRight(t, " ")
}

// scalar converts a scalar, or a flow collection, written on one line
// (comment removed).
func (c *yamlConv) scalar(t []byte) bool {
	var rest []byte
	ok := false
	switch t[0] {
	case '"', '\'':
		rest, ok = c.quoted(t)
	case '{', '[':
		rest, ok = c.flow(t)
	default:
		return c.plain(t)
	}
	return ok && len(bytes.TrimLeft(rest, " ")) == 0
}

// quoted converts the single- or double-quoted scalar t starts with (a
// double-quoted one without escapes) and returns what follows it.
func (c *yamlConv) quoted(t []byte) (rest []byte, ok bool) {
	q := t[0]
	body := t[1:]
	end := bytes.IndexByte(body, q)
	var s []byte // the text, if '' made it differ from body[:end]
	if q == '\'' {
		for end >= 0 && end+1 < len(body) && body[end+1] == '\'' {
			s = append(s, body[:end+1]...)
			body = body[end+2:]
			end = bytes.IndexByte(body, q)
		}
	} else if end >= 0 && bytes.IndexByte(body[:end], '\\') >= 0 {
		return nil, false
	}
	if end < 0 {
		return nil, false
	}
	if s != nil {
		c.jsonString(append(s, body[:end]...))
	} else {
		c.jsonString(body[:end])
	}
	return body[end+1:], true
}

// flow converts the flow mapping or sequence t starts with, on one line,
// of plain keys and of plain scalars without ':', '#' or '?' (or quoted ones),
// and returns what follows it.
func (c *yamlConv) flow(t []byte) (rest []byte, ok bool) {
	open, closing := t[0], byte(']')
	if open == '{' {
		closing = '}'
	}
	c.out = append(c.out, open)
	t = bytes.TrimLeft(t[1:], " ")
	if len(t) > 0 && t[0] == closing {
		c.out = append(c.out, closing)
		return t[1:], true
	}
	var buf [16]member
	ms := buf[:0]
	for {
		if open == '{' {
			key, r, ok := splitKey(t)
			if !ok {
				return nil, false
			}
			if ms, ok = c.addKey(ms, key); !ok {
				return nil, false
			}
			t = r
		}
		if t, ok = c.flowNode(t); !ok {
			return nil, false
		}
		if open == '{' {
			ms[len(ms)-1].end = len(c.out)
		}
		t = bytes.TrimLeft(t, " ")
		switch {
		case len(t) == 0:
			return nil, false
		case t[0] == ',':
			t = bytes.TrimLeft(t[1:], " ")
			if len(t) == 0 || t[0] == closing {
				return nil, false // an empty entry
			}
			if open == '[' {
				c.out = append(c.out, ',')
			}
		case t[0] == closing:
			if open == '{' {
				c.sortMembers(ms)
			}
			c.out = append(c.out, closing)
			return t[1:], true
		default:
			return nil, false
		}
	}
}

// flowNode converts the node t starts with, inside a flow collection.
func (c *yamlConv) flowNode(t []byte) (rest []byte, ok bool) {
	t = bytes.TrimLeft(t, " ")
	if len(t) == 0 {
		return nil, false
	}
	switch t[0] {
	case '{', '[':
		return c.flow(t)
	case '"', '\'':
		return c.quoted(t)
	}
	k := bytes.IndexAny(t, ",]}")
	if k < 0 {
		return nil, false
	}
	p := bytes.TrimRight(t[:k], " ")
	// go-yaml ends a plain scalar in a flow collection at '?' too
	// (scannerc.go, yaml_parser_scan_plain_scalar), and then refuses
	// what follows it.
	if len(p) == 0 || bytes.ContainsAny(p, ":#?") || !c.plain(p) {
		return nil, false
	}
	return t[k:], true
}

// plain converts a plain scalar that YAML 1.1 reads as a string, a
// decimal integer, true, false or null.
func (c *yamlConv) plain(t []byte) bool {
	switch string(t) {
	case "true", "false", "null":
		c.out = append(c.out, t...)
		return true
	}
	if bytes.Contains(t, []byte(": ")) || t[len(t)-1] == ':' || bytes.ContainsAny(t, "[]{},&*!|>%@`\"'\\") {
		return false
	}
	switch {
	case isLetter(t[0]):
		if yaml11Word(t) {
			return false
		}
		return c.jsonString(t)
	case '0' <= t[0] && t[0] <= '9':
		if isDecimal(t) {
			if len(t) > 18 || len(t) > 1 && t[0] == '0' {
				return false // beyond int64, or octal to YAML 1.1
			}
			c.out = append(c.out, t...)
			return true
		}
		if digitString(t) {
			return c.jsonString(t)
		}
	}
	return false
}

func isDecimal(t []byte) bool {
	for _, b := range t {
		if b < '0' || b > '9' {
			return false
		}
	}
	return true
}

// yamlStyleFloat is go-yaml v2's (resolve.go).
var yamlStyleFloat = regexp.MustCompile(`^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`)

// digitString reports whether go-yaml v2 reads t, a plain scalar starting
// with a digit, as a string (its resolve, for such a scalar): not a
// timestamp, nor an integer in any base or with underscores, nor a float.
// An address or a UID, say.
func digitString(t []byte) bool {
	if len(t) > 4 && isDecimal(t[:4]) && t[4] == '-' {
		return false // it may be a timestamp
	}
	if bytes.IndexByte(t, '_') < 0 && !bytes.HasPrefix(t, []byte("0b")) &&
		(bytes.Count(t, []byte(".")) >= 2 || bytes.ContainsAny(t, ":/")) {
		return true // an address: not a number in any form (quicker)
	}
	plain := strings.ReplaceAll(string(t), "_", "")
	if _, err := strconv.ParseInt(plain, 0, 64); err == nil {
		return false
	}
	if _, err := strconv.ParseUint(plain, 0, 64); err == nil {
		return false
	}
	return !yamlStyleFloat.MatchString(plain) && !strings.HasPrefix(plain, "0b")
}

// jsonString appends s, printable ASCII, as a JSON string.
func (c *yamlConv) jsonString(s []byte) bool {
	c.out = append(c.out, '"')
	for _, b := range s {
		if b == '"' || b == '\\' {
			c.out = append(c.out, '\\')
		}
		c.out = append(c.out, b)
	}
	c.out = append(c.out, '"')
	return true
}
