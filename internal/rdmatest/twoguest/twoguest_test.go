package twoguest

import (
	"reflect"
	"testing"
)

func TestParseCounters(t *testing.T) {
	// As rxe in Linux 6.1 prints them (one line).
	out := "link rxe0/1 sent_pkts 75480 rcvd_pkts 1501 duplicate_request 0 out_of_seq_request 0 rcvd_rnr_err 0 send_rnr_err 2 " +
		"rcvd_seq_err 532 ack_deferred 0 retry_exceeded_err 0 retry_rnr_exceeded_err 1 completer_retry_err 529 send_err 0 link_downed 0 rdma_sends 219 rdma_recvs 17 \n"
	c, err := ParseCounters(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(c) != 15 || c["sent_pkts"] != 75480 || c["rdma_recvs"] != 17 {
		t.Fatalf("%v", c)
	}
	if c.RNR() != 3 || c.Retransmissions() != 529 {
		t.Fatalf("RNR %d, retransmissions %d", c.RNR(), c.Retransmissions())
	}
	d := c.Sub(Counters{"sent_pkts": 75000, "completer_retry_err": 29})
	if d["sent_pkts"] != 480 || d.Retransmissions() != 500 || d["rcvd_pkts"] != 1501 {
		t.Fatalf("Sub: %v", d)
	}
	for _, bad := range []string{"", "error: no device", "link rxe0/1", "link rxe0/1 sent_pkts many"} {
		if _, err := ParseCounters(bad); err == nil {
			t.Errorf("ParseCounters(%q) accepted", bad)
		}
	}
}

func TestParseResources(t *testing.T) {
	out := "0: rxe0: pd 1 cq 2 qp 1 cm_id 3 mr 4 ctx 1 srq 0 \n1: rxe1: pd 9 cq 9 qp 9 cm_id 9 mr 9 ctx 9 srq 9 \n"
	r, err := ParseResources(out, "rxe0")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"pd": 1, "cq": 2, "qp": 1, "cm_id": 3, "mr": 4, "ctx": 1, "srq": 0}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("%v, want %v", r, want)
	}
	if _, err := ParseResources(out, "mlx5_0"); err == nil {
		t.Fatal("a missing device was accepted")
	}
}
