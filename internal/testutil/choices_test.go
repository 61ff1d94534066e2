package testutil

import "testing"

func TestChoices(t *testing.T) {
	c := NewChoices([]byte{7, 255, 1, 2, 3})
	if got := c.IntN(5); got != 2 {
		t.Errorf("IntN(5) of 7 = %d, want 2", got)
	}
	if got := c.IntN(256); got != 255 {
		t.Errorf("IntN(256) of 255 = %d, want 255", got)
	}
	if got := c.IntN(1000); got != (1<<8|2)%1000 {
		t.Errorf("IntN(1000) of 1, 2 = %d, want %d (two bytes)", got, (1<<8|2)%1000)
	}
	if got := Pick(c, "a", "b", "c", "d"); got != "d" {
		t.Errorf("Pick of 3 = %q, want d", got)
	}
	if !c.Empty() {
		t.Fatal("input not used up")
	}
	// Used up: every choice is the first option.
	if c.IntN(9) != 0 || c.Bool() || Pick(c, 4, 5) != 4 {
		t.Error("choices after the input ran out are not 0")
	}
}
