//go:build linux && cgo

package device

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/verbline/rdma/internal/verbs"
)

// CreateQP halves the inline room a device refuses down to minInline, then
// asks for none, and remembers what the device granted so later QPs ask
// for it at once.
func TestCreateQPInlineSearch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int   // the device refuses more inline room than this
		want  []int // the inline room of each attempt of the first QP
		later int   // what the second QP asks for
	}{
		{"grants all", 1024, []int{256}, 256},
		{"Soft-iWARP's 80 bytes", 80, []int{256, 128, 64}, 64},
		{"none", 0, []int{256, 128, 64, 32, 0}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked []int
			create := func(c verbs.QPConfig) (*verbs.QP, error) {
				asked = append(asked, c.InlineData)
				if c.InlineData > tc.limit {
					return nil, errors.New("ibv_create_qp: invalid argument")
				}
				return nil, nil
			}
			var granted atomic.Int32
			_, got, err := CreateQP(create, verbs.QPConfig{InlineData: InlineRequest}, &granted)
			if err != nil || got.InlineData != tc.want[len(tc.want)-1] || len(asked) != len(tc.want) {
				t.Fatalf("asked %v, got %d, %v; want %v", asked, got.InlineData, err, tc.want)
			}
			for i := range asked {
				if asked[i] != tc.want[i] {
					t.Fatalf("asked %v, want %v", asked, tc.want)
				}
			}
			asked = nil
			if _, got, err = CreateQP(create, verbs.QPConfig{InlineData: InlineRequest}, &granted); err != nil ||
				len(asked) != 1 || got.InlineData != tc.later {
				t.Fatalf("second QP: asked %v, got %d, %v; want one attempt with %d", asked, got.InlineData, err, tc.later)
			}
		})
	}
}
