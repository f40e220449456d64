package rdmatest

import (
	"maps"
	"testing"
)

// A listing as `rdma -b -` prints it in the Soft-RoCE guest (iproute2
// 6.1): the five kinds one after another, one object per line.
const listing = `link rxe0/1 lqpn 17 rqpn 18 type RC state RTS rq-psn 8672073 sq-psn 4287594 path-mig-state MIGRATED pdn 3 pid 165 comm rping 
link rxe0/1 lqpn 18 rqpn 17 type RC state RTS rq-psn 4287594 sq-psn 8672073 path-mig-state MIGRATED pdn 4 pid 162 comm pong 
link rxe0/1 lqpn 1 type GSI state RTS sq-psn 3 comm [ib_core] 
dev rxe0 cqn 0 cqe 1023 users 2 poll-ctx WORKQUEUE adaptive-moderation off comm [ib_core] 
dev rxe0 cqn 1 cqe 63 users 2 adaptive-moderation off ctxn 1 pid 165 comm rping 
dev rxe0 mrn 2 rkey 0x41a lkey 0x41a mrlen 64 pdn 3 pid 165 comm rping 
dev rxe0 mrn 3 rkey 0x53b lkey 0x53b mrlen 64 pdn 3 pid 165 comm rping 
dev rxe0 mrn 4 rkey 0x0 lkey 0x62e mrlen 16 pdn 4 pid 162 comm rpingx 
dev rxe0 pdn 0 local_dma_lkey 0x113 users 1 comm [ib_core] 
dev rxe0 pdn 3 local_dma_lkey 0x0 users 5 ctxn 1 pid 165 comm rping 
link rxe0/1 cm-idn 0 state LISTEN ps TCP pid 162 comm pong src-addr 169.254.77.1:7174 dst-addr 0.0.0.0:0 
link rxe0/1 cm-idn 1 lqpn 17 qp-type RC state CONNECT ps TCP pid 165 comm rping src-addr 169.254.77.1:47158 dst-addr 169.254.77.1:7174 
`

func TestCountResources(t *testing.T) {
	got, err := countResources(listing, "rping")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"qp": 1, "cq": 1, "mr": 2, "pd": 1, "cm_id": 1}
	if !maps.Equal(got, want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	if got, err := countResources("", "rping"); err != nil || len(got) != 0 {
		t.Fatalf("empty listing: %v, %v", got, err)
	}
	if _, err := countResources(listing+"Error: unknown command \"res\"\n", "rping"); err == nil {
		t.Fatal("a line of no known kind was counted silently")
	}
}
