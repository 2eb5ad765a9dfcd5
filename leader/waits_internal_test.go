package leader

import (
	"testing"

	"github.com/leasehold/leasehold/core"
)

// TestUndosOverlap: while any of two overlapping undos of one acquire is under way, the
// acquire is refused; once the last ends, it registers again.
func TestUndosOverlap(t *testing.T) {
	w := waits{m: make(map[core.LeaseID]map[string]*waitList)}
	var lease core.LeaseID
	lease[0] = 1
	a, b := w.add(lease, "orders"), w.add(lease, "orders")
	if !w.claimUndo(lease, "orders", b, true) { // the later attempt's: nothing newer
		t.Fatal("the later attempt's undo was refused")
	}
	if !w.claimUndo(lease, "orders", a, true) { // then the earlier one's
		t.Fatal("the earlier attempt's undo was refused once the later had left")
	}
	w.undone(lease, "orders")
	if _, ok := w.addUnlessUndoing(lease, "orders"); ok {
		t.Fatal("an acquire registered while the second undo was still under way")
	}
	w.undone(lease, "orders")
	if _, ok := w.addUnlessUndoing(lease, "orders"); !ok {
		t.Fatal("an acquire refused after both undos ended")
	}
}
