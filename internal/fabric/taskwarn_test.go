package fabric

import (
	"testing"
	"time"
)

// A failing task kind is said at most every taskWarnEvery, with how many
// failures went unsaid; each kind on its own pace.
func TestTaskWarnPaced(t *testing.T) {
	var n Node
	t0 := time.Unix(1000, 0)
	if more, ok := n.taskWarn("refresh", t0); !ok || more != 0 {
		t.Fatalf("first failure: said %v, more %d; want said, 0", ok, more)
	}
	for i := 1; i <= 99; i++ { // one per 100 ms announce interval
		if _, ok := n.taskWarn("refresh", t0.Add(time.Duration(i)*100*time.Millisecond)); ok {
			t.Fatalf("failure %d, %v after the first, was said", i, time.Duration(i)*100*time.Millisecond)
		}
	}
	if _, ok := n.taskWarn("holders", t0.Add(time.Second)); !ok {
		t.Fatal("another kind's first failure was not said")
	}
	if more, ok := n.taskWarn("refresh", t0.Add(taskWarnEvery)); !ok || more != 99 {
		t.Fatalf("after %v: said %v, more %d; want said with the 99 unsaid", taskWarnEvery, ok, more)
	}
}
