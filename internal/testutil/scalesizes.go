package testutil

import "testing"

// ScaleSizes is the sizes a scale benchmark (or test) runs: all of them,
// or under -short only the first short, the ones that stay quick.
func ScaleSizes(short int, sizes ...int) []int {
	if testing.Short() {
		return sizes[:short]
	}
	return sizes
}
