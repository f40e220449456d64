package rdmaexpvar

import (
	"encoding/json"
	"expvar"
	"net/http/httptest"
	"strings"
	"testing"
)

// Host test: publication, a second Publish refused, and the JSON that
// /debug/vars serves (the RDMA test scrapes real connections).
func TestPublish(t *testing.T) {
	if err := Publish(""); err == nil {
		t.Error("an empty name was accepted")
	}
	if err := Publish("rdma_test_publish"); err != nil {
		t.Fatal(err)
	}
	err := Publish("rdma_test_publish")
	if err == nil || !strings.Contains(err.Error(), "already published") {
		t.Errorf("second Publish of the name: %v, want an error saying it is taken", err)
	}
	expvar.NewInt("rdma_test_taken")
	if err := Publish("rdma_test_taken"); err == nil {
		t.Error("Publish of a name another package took: no error")
	}

	rec := httptest.NewRecorder()
	expvar.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/vars", nil))
	var vars map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &vars); err != nil {
		t.Fatalf("/debug/vars is not JSON: %v\n%s", err, rec.Body)
	}
	var m struct {
		ConnsOpen  *int64
		ConnsTotal *uint64
		BytesSent  *uint64
		Parks      *uint64
		Devices    []any
	}
	if err := json.Unmarshal(vars["rdma_test_publish"], &m); err != nil {
		t.Fatalf("rdma_test_publish: %v\n%s", err, vars["rdma_test_publish"])
	}
	if m.ConnsOpen == nil || m.ConnsTotal == nil || m.BytesSent == nil || m.Parks == nil {
		t.Errorf("rdma_test_publish lacks the totals: %s", vars["rdma_test_publish"])
	}
}
