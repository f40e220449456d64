//go:build linux && cgo

package verbs

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
)

// A failed completion names its status as ibv_wc_status_str does, the QP
// and the operation; a successful one is no error.
func TestCompletionErrorText(t *testing.T) {
	wc := WC{WRID: 0x0000010500000003, Status: WCRemAccessErr, VendorErr: 0x89, QPNum: 0x11}
	err := wc.ErrOp("RDMA write")
	want := "RDMA write on QP 0x11 failed: remote access error (work completion status 10, vendor error 0x89)"
	if err == nil || err.Error() != want {
		t.Fatalf("got  %v\nwant %s", err, want)
	}
	var ce *CompletionError
	if !errors.As(err, &ce) || ce.Status != WCRemAccessErr || ce.WRID != wc.WRID || ce.QPN != 0x11 || ce.Op != "RDMA write" {
		t.Fatalf("fields %+v", ce)
	}
	if got := wc.Err().Error(); got != "work request 0x10500000003 on QP 0x11 failed: remote access error "+
		"(work completion status 10, vendor error 0x89)" {
		t.Fatalf("without an operation: %q", got)
	}
	for _, s := range []WCStatus{WCRetryExcErr, WCRNRRetryExcErr, WCWRFlushErr, WCLocProtErr} {
		err := (&WC{Status: s}).ErrOp("x")
		if err == nil || !strings.Contains(err.Error(), s.String()) || s.String() == "" {
			t.Errorf("status %d: %v", s, err)
		}
	}
	if (&WC{Status: WCSuccess}).ErrOp("x") != nil {
		t.Fatal("a successful completion is an error")
	}
}

// An errno carries its symbolic name and still matches with errors.Is.
func TestErrnoText(t *testing.T) {
	err := errnoErr("ibv_modify_qp", nil, 22)
	if err.Error() != "ibv_modify_qp: invalid argument (EINVAL)" || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("got %q", err)
	}
	err = errnoErr("ibv_create_qp", syscall.ENOMEM, 0)
	if err.Error() != "ibv_create_qp: cannot allocate memory (ENOMEM)" || !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("got %q", err)
	}
	err = postError("ibv_post_send", 0x1a, 12+256*3)
	if err.Error() != "ibv_post_send QP 0x1a (request 3 of the batch): cannot allocate memory (ENOMEM)" ||
		!errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("got %q", err)
	}
	if got := errnoText(syscall.Errno(4000)); got != fmt.Sprintf("%s (errno 4000)", syscall.Errno(4000).Error()) {
		t.Fatalf("unknown errno: %q", got)
	}
}
