package ui_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/leasehold/leasehold/api/leasehold/v1/leaseholdv1connect"
	"github.com/leasehold/leasehold/client"
	"github.com/leasehold/leasehold/internal/auth"
	"github.com/leasehold/leasehold/internal/testnode"
	"github.com/leasehold/leasehold/replication"
	"github.com/leasehold/leasehold/service"
	"github.com/leasehold/leasehold/ui"
)

// TestDashboardInBrowser opens /ui of a node in headless Chromium and checks what a
// user sees: a lock a client takes appears with its holder and token within a second,
// and its TTL counts down; a second client queued behind it shows as a waiter; a click
// on the lock opens its panel; the release shows in the event feed, and the waiter's
// grant in the table, within a second. It saves screenshots and fails on any console
// error or uncaught exception of the page.
func TestDashboardInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a leasehold node and a browser")
	}
	path := chromium(t)
	node := testnode.Start(t)
	b := startBrowser(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	b.open(t, "http://"+node.Addr()+"/ui")
	b.wait(t, `["live", "polling"].includes(document.querySelector("#live").textContent)`, 5*time.Second)

	c, err := client.Dial(ctx, node.Addr(), client.WithHolder(client.Holder{Host: "ui-test", PID: 4242}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	const name = "jobs/nightly"
	l, err := c.Lock(ctx, name, client.Correctness, client.WithNote("browser test"))
	if err != nil {
		t.Fatal(err)
	}
	row := fmt.Sprintf(`document.querySelector('#locks tr[data-name=%q]')`, name)
	b.wait(t, fmt.Sprintf(`(r => r && r.querySelector("td.token").textContent === "%d" && r.querySelector("td.holder").textContent.includes("ui-test:4242 — browser test"))(%s)`, l.Token(), row), time.Second)
	b.wait(t, row+`.querySelector("td.ttl").textContent.endsWith(" s")`, time.Second)
	// The TTL counts down between updates.
	b.wait(t, `(window.firstTTL = parseFloat(`+row+`.querySelector("td.ttl").textContent)) > 0`, time.Second)
	b.wait(t, `parseFloat(`+row+`.querySelector("td.ttl").textContent) < window.firstTTL`, time.Second)

	// A second client queues behind the holder.
	c2, err := client.Dial(ctx, node.Addr(), client.WithHolder(client.Holder{Host: "ui-waiter", PID: 7}))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(context.Background())
	granted := make(chan *client.Lock, 1)
	go func() {
		l2, err := c2.Lock(ctx, name, client.Correctness, client.WaitFor(20*time.Second))
		if err != nil {
			t.Error(err)
		}
		granted <- l2
	}()
	b.wait(t, row+`.querySelector("td.waiters").textContent === "1" && document.querySelector('#feed li[data-kind="queued"]') !== null`, 2*time.Second)

	if err := b.do(chromedp.Click(chromedp.CSS(`#locks tr[data-name="` + name + `"]`))); err != nil {
		t.Fatal(err)
	}
	b.wait(t, fmt.Sprintf(`!document.querySelector("#ledger-section").hidden && document.querySelector("#ledger-now").textContent.includes("#%d ui-test:4242")`, l.Token()), 2*time.Second)
	b.wait(t, fmt.Sprintf(`(r => r && r.dataset.end === "held" && r.textContent.includes("held now"))(document.querySelector('#ledger tbody tr[data-token="%d"]'))`, l.Token()), time.Second)
	b.screenshot(t, "held.png")

	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	b.wait(t, fmt.Sprintf(`document.querySelector('#feed li[data-kind="released"][data-name=%q][data-token="%d"]') !== null`, name, l.Token()), time.Second)
	l2 := <-granted
	if l2 == nil {
		t.FailNow()
	}
	b.wait(t, fmt.Sprintf(`(r => r && r.querySelector("td.token").textContent === "%d" && r.querySelector("td.holder").textContent.includes("ui-waiter:7") && r.querySelector("td.waiters").textContent === "0")(%s)`, l2.Token(), row), time.Second)
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	b.wait(t, fmt.Sprintf(`document.querySelector('#feed li[data-kind="released"][data-token="%d"]') !== null && %s === null`, l2.Token(), row), time.Second)
	b.wait(t, `document.querySelector("#ledger-now").textContent.includes("not held")`, 2*time.Second)
	// The ledger, newest first: both tenures, released.
	b.wait(t, fmt.Sprintf(`(rows => rows.length === 2 && rows[0].dataset.token === "%d" && rows[0].dataset.end === "released" && rows[0].textContent.includes("ui-waiter:7") && rows[1].dataset.token === "%d" && rows[1].dataset.end === "released" && rows[1].textContent.includes("ui-test:4242"))([...document.querySelectorAll("#ledger tbody tr")])`, l2.Token(), l.Token()), time.Second)
	b.wait(t, `document.querySelector("#members tbody tr") !== null`, 3*time.Second)
	b.screenshot(t, "released.png")
	b.checkConsole(t)
}

// TestDashboardOnFollower opens /ui of a follower: it shows the locks the leader holds
// (its List is forwarded) and the cluster as the follower sees it.
func TestDashboardOnFollower(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two leasehold nodes and a browser")
	}
	path := chromium(t)
	leader := testnode.StartWith(t, func(c *service.Config) { c.Raft.NodeID, c.Raft.RaftAddr = "n1", testnode.FreeAddr(t) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	follower, _ := startFollower(ctx, t, "n2", leader.Addr())
	b := startBrowser(t, path)
	c, err := client.Dial(ctx, leader.Addr(), client.WithHolder(client.Holder{Host: "ui-test", PID: 7}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	l, err := c.Lock(ctx, "jobs/on-leader", client.Efficiency)
	if err != nil {
		t.Fatal(err)
	}

	b.open(t, "http://"+follower.Addr()+"/ui/")
	b.wait(t, fmt.Sprintf(`(r => r && r.querySelector("td.token").textContent === "%d" && r.querySelector("td.class").textContent === "efficiency")(document.querySelector('#locks tr[data-name="jobs/on-leader"]'))`, l.Token()), 2*time.Second)
	b.wait(t, `document.querySelector("#node").textContent === "node n2 (follower)" && document.querySelectorAll("#members tbody tr").length === 2`, 5*time.Second)
	b.wait(t, `document.querySelector('#members tr[data-node="n1"]').textContent.includes("leading")`, time.Second)
	b.screenshot(t, "follower.png")
	b.checkConsole(t)
}

// startFollower starts node id, joining the cluster of the node at join, and waits
// until it is ready to serve as a follower. The test's end closes it; so does the
// returned func, once.
func startFollower(ctx context.Context, t *testing.T, id, join string) (*service.Node, func()) {
	t.Helper()
	n, err := service.Start(service.Config{
		Addr:         "127.0.0.1:0",
		FastLaneAddr: "127.0.0.1:0",
		Raft:         replication.Config{NodeID: id, DataDir: t.TempDir(), RaftAddr: testnode.FreeAddr(t)},
		Join:         join,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	closeNode := func() { once.Do(func() { _ = n.Close(context.Background()) }) }
	t.Cleanup(closeNode)
	for ok, why := n.Server.Ready(); !ok; ok, why = n.Server.Ready() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s not ready as a follower: %s", id, why)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return n, closeNode
}

// TestDashboardAcrossLeaderChange opens /ui of a follower of a three-node cluster and
// stops the leader: the page's Watch, relayed by the follower, ends; the page resumes
// from its last revision once a new leader serves, and the feed shows every lock event
// from before and after the change once each, in revision order. An efficiency lock
// taken on the new leader shows its tenure in its ledger, after the marker of what the
// old leader's memory held (lost with it).
func TestDashboardAcrossLeaderChange(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three leasehold nodes and a browser")
	}
	path := chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n1 := testnode.StartWith(t, func(c *service.Config) { c.Raft.NodeID, c.Raft.RaftAddr = "n1", testnode.FreeAddr(t) })
	n2, _ := startFollower(ctx, t, "n2", n1.Addr())
	startFollower(ctx, t, "n3", n1.Addr())
	b := startBrowser(t, path)
	// While there is no leader, a List is answered Unavailable (503), and the browser
	// logs it as a failed load.
	b.expect("the server responded with a status of 503")
	c, err := client.Dial(ctx, n2.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())

	b.open(t, "http://"+n2.Addr()+"/ui")
	b.wait(t, `document.querySelector("#live").textContent === "live"`, 5*time.Second)
	a, err := c.Lock(ctx, "lc/a", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	b.wait(t, `document.querySelector('#feed li[data-kind="acquired"][data-name="lc/a"]') !== null`, time.Second)

	// n1 stops; n2 or n3 takes over.
	if err := n1.Close(ctx); err != nil {
		t.Logf("n1 close: %v", err)
	}
	for st := n2.Raft.Status(); st.LeaderID == "" || st.LeaderID == "n1"; st = n2.Raft.Status() {
		if ctx.Err() != nil {
			t.Fatal("no new leader")
		}
		time.Sleep(20 * time.Millisecond)
	}
	bl, err := c.Lock(ctx, "lc/b", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	if err := bl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	b.expectNested(t, "lc/", 10*time.Second)
	b.screenshot(t, "leader-change.png")

	// An efficiency lock on the new leader: its ledger shows the hold, then the marker
	// of what the old leader's memory held (the new leader's epoch, when it began).
	el, err := c.Lock(ctx, "eff/after", client.Efficiency)
	if err != nil {
		t.Fatal(err)
	}
	b.wait(t, `document.querySelector('#locks tr[data-name="eff/after"]') !== null`, 2*time.Second)
	if err := b.do(chromedp.Click(chromedp.CSS(`#locks tr[data-name="eff/after"]`))); err != nil {
		t.Fatal(err)
	}
	b.wait(t, fmt.Sprintf(`(rows => rows.length === 2 && rows[0].dataset.token === "%d" && rows[0].dataset.end === "held" && rows[0].textContent.includes("efficiency") && rows[1].dataset.end === "leader lost" && rows[1].textContent.includes("lost with the leader") && rows[1].textContent.includes("epoch "))([...document.querySelectorAll("#ledger tbody tr")])`, el.Token()), 2*time.Second)
	b.screenshot(t, "efficiency-ledger.png")
	if err := el.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	b.wait(t, fmt.Sprintf(`(rows => rows.length === 2 && rows[0].dataset.token === "%d" && rows[0].dataset.end === "released" && rows[1].dataset.end === "leader lost")([...document.querySelectorAll("#ledger tbody tr")])`, el.Token()), 2*time.Second)
	b.checkConsole(t)
}

// TestDashboardWithAuth opens /ui of a node with auth on: the page asks for a token,
// asks again for one the node does not know, says "not allowed" for what the token may
// not read, and shows what it may.
func TestDashboardWithAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a leasehold node and a browser")
	}
	path := chromium(t)
	a, err := auth.Load(writeAuthFile(t, map[string]string{"root": "", "jobs-reader": "jobs/"}))
	if err != nil {
		t.Fatal(err)
	}
	node := testnode.StartWith(t, func(c *service.Config) { c.Server.Auth = a })
	b := startBrowser(t, path)
	// Status with an unknown token is refused with 401, a List of every name with 403:
	// the browser logs those loads as failed.
	b.expect("the server responded with a status of 401")
	b.expect("the server responded with a status of 403")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, node.Addr(), client.WithToken("root"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	for _, name := range []string{"jobs/visible", "other/hidden"} {
		if _, err := c.Lock(ctx, name, client.Correctness); err != nil {
			t.Fatal(err)
		}
	}

	b.open(t, "http://"+node.Addr()+"/ui")
	b.wait(t, `!document.querySelector("#auth").hidden && document.querySelector("#live").textContent === "needs a token"`, 5*time.Second)
	// A token the node does not know: it asks again.
	if err := b.do(chromedp.SendKeys(chromedp.CSS("#token"), "nobody"), chromedp.Click(chromedp.CSS("#auth button"))); err != nil {
		t.Fatal(err)
	}
	b.wait(t, `document.querySelector("#error").textContent.includes("token needed or not known: ") && !document.querySelector("#auth").hidden`, 2*time.Second)
	if err := b.do(chromedp.SendKeys(chromedp.CSS("#token"), "jobs-reader"), chromedp.Click(chromedp.CSS("#auth button"))); err != nil {
		t.Fatal(err)
	}
	b.wait(t, `document.querySelector("#error").textContent.startsWith("locks: not allowed: ")`, 2*time.Second)
	b.wait(t, `sessionStorage.getItem("leasehold.token") === "jobs-reader" && document.querySelector("#auth").hidden`, time.Second)
	b.wait(t, `document.querySelector("#members tbody tr") !== null`, 3*time.Second)
	if err := b.do(chromedp.SendKeys(chromedp.CSS("#prefix"), "jobs/\r")); err != nil {
		t.Fatal(err)
	}
	b.wait(t, `document.querySelector('#locks tr[data-name="jobs/visible"]') !== null && document.querySelector("#error").hidden`, 2*time.Second)
	b.wait(t, `document.querySelectorAll("#locks tbody tr").length === 1`, time.Second)
	b.screenshot(t, "auth.png")
	b.checkConsole(t)
}

// writeAuthFile writes an auth file of tokens (token → the prefix it may read and
// lock; "" for admin on every name). Each token's name is its secret.
func writeAuthFile(t *testing.T, tokens map[string]string) string {
	t.Helper()
	var list []map[string]any
	for name, prefix := range tokens {
		allow := []string{"read", "lock"}
		if prefix == "" {
			allow = []string{"admin"}
		}
		sum := sha256.Sum256([]byte(name))
		list = append(list, map[string]any{"name": name, "sha256": hex.EncodeToString(sum[:]),
			"rules": []map[string]any{{"prefix": prefix, "allow": allow}}})
	}
	b, err := json.Marshal(map[string]any{"tokens": list})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// browser is a headless Chromium tab, with the console errors and exceptions it saw.
type browser struct {
	ctx      context.Context
	mu       sync.Mutex
	problems []string
	expected []string // problems that contain one of these are expected
}

// expect makes checkConsole accept logged errors that contain text.
func (b *browser) expect(text string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.expected = append(b.expected, text)
}

// chromium returns the path of Chromium: LEASEHOLD_TEST_CHROMIUM, else chromium on
// PATH. Without it the test is skipped, except under CI, where it fails:
// scripts/chromium.sh installs it.
func chromium(t *testing.T) string {
	t.Helper()
	path := os.Getenv("LEASEHOLD_TEST_CHROMIUM")
	if path == "" {
		path, _ = exec.LookPath("chromium")
	}
	if path == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("no chromium: set LEASEHOLD_TEST_CHROMIUM (eval \"$(bash scripts/chromium.sh)\")")
		}
		t.Skip("no chromium (eval \"$(bash scripts/chromium.sh)\" installs it)")
	}
	return path
}

// startBrowser starts headless Chromium at path for the test. Start it after the nodes
// it reads: it stops first when the test ends, so no stream of the page holds up a
// node's shutdown.
func startBrowser(t *testing.T, path string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1400, 900),
		chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &browser{ctx: ctx}
	if err := chromedp.Listen(ctx, b.observe); err != nil {
		t.Fatal(err)
	}
	return b
}

// observe records the console errors, uncaught exceptions and failed loads of the page.
func (b *browser) observe(ev any) {
	var p string
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if ev.Type != runtime.ConsoleAPICalledTypeError && ev.Type != runtime.ConsoleAPICalledTypeAssert {
			return
		}
		args := make([]string, 0, len(ev.Args))
		for _, a := range ev.Args {
			args = append(args, a.Description+string(a.Value))
		}
		p = "console." + string(ev.Type) + ": " + strings.Join(args, " ")
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		p = fmt.Sprintf("exception at %s:%d:%d: %s", d.URL, d.LineNumber+1, d.ColumnNumber+1, d.Text)
		if d.Exception != nil {
			p += " " + d.Exception.Description
		}
	case *log.EventEntryAdded:
		if ev.Entry.Level != log.EntryLevelError {
			return
		}
		p = fmt.Sprintf("log %s: %s %s", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL)
	default:
		return
	}
	b.mu.Lock()
	b.problems = append(b.problems, p)
	b.mu.Unlock()
}

func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	return chromedp.Do(ctx, steps...)
}

func (b *browser) open(t *testing.T, url string) {
	t.Helper()
	if err := b.do(chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
}

// wait waits up to d for the JavaScript expression cond to be true.
func (b *browser) wait(t *testing.T, cond string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d+5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](cond, chromedp.WithPollingTimeout(d), chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
		b.checkConsole(t)
		t.Fatalf("not true within %v: %s (%v)\npage: %s", d, cond, err, b.text())
	}
	t.Logf("after %v: %s", time.Since(start).Round(time.Millisecond), cond)
}

// feed returns the feed's entries for the locks under prefix, oldest first, as "kind
// name", and fails the test unless every entry of the feed, of any lock, has a revision
// above the one before.
// expectNested waits (up to timeout, the page live again) for the feed's four events of
// a lock PREFIX+"a" taken, PREFIX+"b" taken, then both released in reverse, and checks
// that they came once each and in that order.
func (b *browser) expectNested(t *testing.T, prefix string, timeout time.Duration) {
	t.Helper()
	b.wait(t, `document.querySelectorAll('#feed li[data-name^="`+prefix+`"]').length >= 4 && document.querySelector("#live").textContent === "live"`, timeout)
	got := b.feed(t, prefix)
	want := []string{"acquired " + prefix + "a", "acquired " + prefix + "b", "released " + prefix + "b", "released " + prefix + "a"}
	if !slices.Equal(got, want) {
		t.Errorf("feed (oldest first) %q, want %q", got, want)
	}
}

func (b *browser) feed(t *testing.T, prefix string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	feed, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#feed li")].reverse().map(li => li.dataset.kind + " " + (li.dataset.name || "-") + " " + (li.dataset.revision || "-"))`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	last := [2]int{}
	for _, e := range feed {
		f := strings.Fields(e)
		var rev [2]int
		if _, err := fmt.Sscanf(f[2], "%d.%d", &rev[0], &rev[1]); err != nil {
			t.Fatalf("feed entry %q: %v", e, err)
		}
		if rev[0] < last[0] || rev[0] == last[0] && rev[1] <= last[1] {
			t.Errorf("feed entry %q does not follow revision %d.%d", e, last[0], last[1])
		}
		last = rev
		if strings.HasPrefix(f[1], prefix) {
			got = append(got, f[0]+" "+f[1])
		}
	}
	return got
}

// text returns the page's visible text, for failure messages.
func (b *browser) text() string {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		return err.Error()
	}
	return s
}

// screenshot saves the page as an artifact: under LEASEHOLD_TEST_ARTIFACTS when set
// (CI), else in the test's artifact directory (go test -artifacts keeps it).
func (b *browser) screenshot(t *testing.T, file string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("LEASEHOLD_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.ArtifactDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, t.Name()+"-"+file)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// checkConsole fails the test if the page logged an error or threw.
func (b *browser) checkConsole(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		if slices.ContainsFunc(b.expected, func(e string) bool { return strings.Contains(p, e) }) {
			t.Logf("expected: %s", p)
		} else {
			t.Error(p)
		}
	}
}

// TestDashboardResumesWatch cuts the page's Watch stream (a proxy between the browser
// and the node aborts it, and holds the page's next Watch until told) while locks
// change: once the stream is back, the feed shows every event of the gap, once each, in
// revision order. The proxy passes the stream on 3 bytes at a time, so the page's parser
// meets envelopes split anywhere, the 5-byte prefix too.
func TestDashboardResumesWatch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a leasehold node and a browser")
	}
	path := chromium(t)
	node := testnode.Start(t)
	proxy := newCutProxy(t, node.Addr())
	b := startBrowser(t, path)
	// The aborted stream is logged as a failed load.
	b.expect("net::ERR_")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())

	b.open(t, "http://"+proxy.addr+"/ui")
	b.wait(t, `document.querySelector("#live").textContent === "live"`, 5*time.Second)
	a, err := c.Lock(ctx, "gap/a", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	b.wait(t, `document.querySelector('#feed li[data-kind="acquired"][data-name="gap/a"]') !== null`, time.Second)

	proxy.cut()
	b.wait(t, `document.querySelector("#live").textContent === "reconnecting"`, 2*time.Second)
	bl, err := c.Lock(ctx, "gap/b", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	if err := bl.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.resume()

	b.expectNested(t, "gap/", 3*time.Second)
	b.screenshot(t, "resumed.png")
	b.checkConsole(t)
}

// TestDashboardPollsWithoutWatch opens the page of a node that, as far as the page can
// tell, serves no Watch (an older node: a proxy takes Watch out of /ui/config.json):
// the page lists the locks every 500 ms and derives the feed from the differences.
func TestDashboardPollsWithoutWatch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a leasehold node and a browser")
	}
	path := chromium(t)
	node := testnode.Start(t)
	proxy := newCutProxy(t, node.Addr())
	proxy.rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.URL.Path != "/ui/config.json" {
			return nil
		}
		var cfg ui.Config
		if err := json.NewDecoder(resp.Body).Decode(&cfg); err != nil {
			return err
		}
		_ = resp.Body.Close()
		cfg.Procedures = slices.DeleteFunc(cfg.Procedures, func(p string) bool { return p == leaseholdv1connect.LockServiceWatchProcedure })
		b, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
		return nil
	}
	b := startBrowser(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())

	b.open(t, "http://"+proxy.addr+"/ui")
	b.wait(t, `document.querySelector("#live").textContent === "polling"`, 5*time.Second)
	l, err := c.Lock(ctx, "poll/a", client.Correctness)
	if err != nil {
		t.Fatal(err)
	}
	b.wait(t, fmt.Sprintf(`(r => r && r.querySelector("td.token").textContent === "%d")(document.querySelector('#locks tr[data-name="poll/a"]'))`, l.Token()), 2*time.Second)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	b.wait(t, fmt.Sprintf(`document.querySelector('#feed li[data-kind="released"][data-token="%d"]') !== null`, l.Token()), 2*time.Second)
	b.checkConsole(t)
}

// cutProxy forwards a browser's requests to a node, and can cut the Watch streams
// open through it and hold new ones until resume.
type cutProxy struct {
	addr string
	rp   *httputil.ReverseProxy

	mu      sync.Mutex
	streams map[*context.CancelFunc]struct{}
	hold    chan struct{} // closed by resume; nil when not holding
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	p := &cutProxy{
		rp: &httputil.ReverseProxy{
			Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(&url.URL{Scheme: "http", Host: target}) },
			FlushInterval: -1,
			ErrorLog:      stdlog.New(io.Discard, "", 0),
		},
		streams: make(map[*context.CancelFunc]struct{}),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	srv := &http.Server{Handler: p, ErrorLog: stdlog.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { p.resume(); _ = srv.Close() })
	return p
}

func (p *cutProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != leaseholdv1connect.LockServiceWatchProcedure {
		p.rp.ServeHTTP(w, r)
		return
	}
	p.mu.Lock()
	hold := p.hold
	p.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	p.mu.Lock()
	p.streams[&cancel] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.streams, &cancel)
		p.mu.Unlock()
	}()
	p.rp.ServeHTTP(trickle{w}, r.WithContext(ctx))
}

// trickle writes what it is given 3 bytes at a time, each flushed, 1 ms apart.
type trickle struct{ http.ResponseWriter }

func (t trickle) Write(b []byte) (int, error) {
	rc := http.NewResponseController(t.ResponseWriter)
	for i := 0; i < len(b); i += 3 {
		if _, err := t.ResponseWriter.Write(b[i:min(i+3, len(b))]); err != nil {
			return i, err
		}
		if err := rc.Flush(); err != nil {
			return i, err
		}
		time.Sleep(time.Millisecond) // so that the browser reads the pieces apart
	}
	return len(b), nil
}

// Flush is the ResponseWriter's (the proxy flushes after each write).
func (t trickle) Flush() { _ = http.NewResponseController(t.ResponseWriter).Flush() }

// cut aborts every Watch stream open through the proxy, and holds the next ones.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold == nil {
		p.hold = make(chan struct{})
	}
	for cancel := range p.streams {
		(*cancel)()
	}
}

// resume lets the held Watch requests through.
func (p *cutProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold != nil {
		close(p.hold)
		p.hold = nil
	}
}

// TestDashboardKeepsUp measures how many events per second the page follows: workers
// take and release locks as fast as they can for LEASEHOLD_UI_LOAD (a duration, e.g.
// 5s; the test is skipped without it) while the page and a Go watcher follow the same
// prefix; then it waits until the page has shown every event the watcher saw.
//
//	LEASEHOLD_UI_LOAD=5s go test -run TestDashboardKeepsUp -v ./ui/
func TestDashboardKeepsUp(t *testing.T) {
	load, err := time.ParseDuration(os.Getenv("LEASEHOLD_UI_LOAD"))
	if err != nil {
		t.Skip("set LEASEHOLD_UI_LOAD to a duration to measure")
	}
	const workers = 16
	path := chromium(t)
	node := testnode.Start(t)
	b := startBrowser(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), load+60*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, node.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	b.open(t, "http://"+node.Addr()+"/ui")
	b.wait(t, `document.querySelector("#live").textContent === "live"`, 5*time.Second)

	var seen atomic.Int64
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		for _, err := range c.Watch(wctx, "") {
			if err != nil {
				return
			}
			seen.Add(1)
		}
	}()
	time.Sleep(200 * time.Millisecond) // the watcher's stream stands

	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for time.Since(start) < load {
				l, err := c.Lock(ctx, fmt.Sprintf("load/w%d", w), client.Correctness)
				if err != nil {
					t.Error(err)
					return
				}
				if err := l.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	time.Sleep(100 * time.Millisecond) // the watcher gets the last events
	total := seen.Load()
	b.wait(t, fmt.Sprintf(`Number(document.querySelector("#feed").dataset.count || 0) >= %d`, total), 30*time.Second)
	caughtUp := time.Since(start) - took
	t.Logf("%d events in %v (%.0f/s) from %d workers; the page showed them all %v after the load ended",
		total, took.Round(time.Millisecond), float64(total)/took.Seconds(), workers, caughtUp.Round(time.Millisecond))
	b.checkConsole(t)
}

// TestDashboardMalformedPrefixLink: a #prefix= link with a malformed escape (typed or
// cut by hand) opens the dashboard with that text as the prefix. decodeURIComponent
// throws on it, and the page used to stop before it ever started.
func TestDashboardMalformedPrefixLink(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a leasehold node and a browser")
	}
	path := chromium(t)
	node := testnode.Start(t)
	b := startBrowser(t, path)
	b.open(t, "http://"+node.Addr()+"/ui#prefix=%E0")
	b.wait(t, `["live", "polling"].includes(document.querySelector("#live").textContent) && document.querySelector("#prefix").value === "%E0"`, 5*time.Second)
	b.checkConsole(t)
}
