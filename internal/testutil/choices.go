package testutil

// Choices hands out the decisions of a randomized test (how many of
// something, which of a few values, whether a write fails) from a fuzzer's
// input bytes, so that the fuzzer's coverage-guided mutations steer them:
// a fuzz target builds its Service, its desired states or its failures
// from a Choices. Once the bytes run out every choice is 0, the first
// option, so any input, the empty one included, is a complete case.
//
// Its IntN has the signature of math/rand/v2's (*Rand).IntN, so a test can
// take its decisions from either: seeded pseudo-random ones in plain `go
// test`, the fuzzer's under `go test -fuzz`.
type Choices struct {
	b []byte
}

// NewChoices returns the choices that input makes.
func NewChoices(input []byte) *Choices { return &Choices{b: input} }

// Empty reports whether the input is used up.
func (c *Choices) Empty() bool { return len(c.b) == 0 }

// IntN returns a choice in [0, n): one byte of the input for n up to 256,
// two beyond. It panics if n <= 0, as rand's does.
func (c *Choices) IntN(n int) int {
	if n <= 0 {
		panic("testutil.Choices.IntN: n <= 0")
	}
	v := int(c.next())
	if n > 256 {
		v = v<<8 | int(c.next())
	}
	return v % n
}

// Bool returns a choice of true or false.
func (c *Choices) Bool() bool { return c.IntN(2) == 1 }

func (c *Choices) next() byte {
	if len(c.b) == 0 {
		return 0
	}
	v := c.b[0]
	c.b = c.b[1:]
	return v
}

// Pick returns one of options, chosen by c.
func Pick[T any](c *Choices, options ...T) T { return options[c.IntN(len(options))] }
