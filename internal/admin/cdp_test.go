package admin_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// A small Chrome DevTools Protocol client over --remote-debugging-pipe:
// Chromium reads commands on its fd 3 and writes replies and events on its
// fd 4, each a JSON message ended by a NUL byte. The pipe needs no port and
// no WebSocket library, so driving the dashboard adds no dependency.

// cdpCallTimeout bounds one protocol call; a page condition (waitFor) is
// bounded by its own, shorter timeout, and answers within this one.
const cdpCallTimeout = 90 * time.Second

type cdpReply struct {
	ID        int64           `json:"id"`
	Result    json.RawMessage `json:"result"`
	Error     *cdpError       `json:"error"`
	Method    string          `json:"method"`
	Params    json.RawMessage `json:"params"`
	SessionID string          `json:"sessionId"`
}

type cdpError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// browser is one headless Chromium with one page attached. Its methods
// that fail a test take the test (or subtest) they run in.
type browser struct {
	cmd     *exec.Cmd
	w       io.WriteCloser
	session string
	exited  chan struct{}

	mu      sync.Mutex
	next    int64
	pending map[int64]chan cdpReply
	errs    []string // uncaught page exceptions and console errors
}

// startBrowser starts Chromium with a 1400-pixel-wide page and stops it
// when the test ends.
func startBrowser(t *testing.T, bin string) *browser {
	t.Helper()
	cmdR, cmdW, err := os.Pipe() // we write commands, Chromium reads (its fd 3)
	if err != nil {
		t.Fatal(err)
	}
	evR, evW, err := os.Pipe() // Chromium writes (its fd 4), we read
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars", "--user-data-dir="+t.TempDir(),
		"about:blank")
	cmd.ExtraFiles = []*os.File{cmdR, evW}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = cmdR.Close()
	_ = evW.Close()
	b := &browser{cmd: cmd, w: cmdW, pending: map[int64]chan cdpReply{}, exited: make(chan struct{})}
	go b.read(evR)
	go func() { _ = cmd.Wait(); close(b.exited) }()
	t.Cleanup(func() {
		_, _ = b.call("", "Browser.close", nil)
		select {
		case <-b.exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-b.exited
		}
		_ = cmdW.Close()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("chromium stderr (tail):\n%s", tail(stderr.String(), 2000))
		}
	})

	var target struct {
		TargetID string `json:"targetId"`
	}
	b.must(t, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var att struct {
		SessionID string `json:"sessionId"`
	}
	b.must(t, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att)
	b.session = att.SessionID
	b.must(t, b.session, "Runtime.enable", nil, nil)
	b.must(t, b.session, "Page.enable", nil, nil)
	b.resize(t, 1400, 1000)
	return b
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// read delivers replies to their callers and keeps the page's errors.
func (b *browser) read(r io.ReadCloser) {
	defer r.Close()
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		msg, err := br.ReadBytes(0)
		if err != nil {
			b.mu.Lock()
			for id, ch := range b.pending {
				close(ch)
				delete(b.pending, id)
			}
			b.mu.Unlock()
			return
		}
		var m cdpReply
		if json.Unmarshal(msg[:len(msg)-1], &m) != nil {
			continue
		}
		b.mu.Lock()
		switch {
		case m.ID != 0:
			if ch := b.pending[m.ID]; ch != nil {
				ch <- m
				delete(b.pending, m.ID)
			}
		case m.Method == "Runtime.exceptionThrown":
			b.errs = append(b.errs, "exception: "+string(m.Params))
		case m.Method == "Runtime.consoleAPICalled" && strings.Contains(string(m.Params), `"type":"error"`):
			b.errs = append(b.errs, "console.error: "+string(m.Params))
		}
		b.mu.Unlock()
	}
}

// call sends one command (to the browser when session is "") and waits
// for its reply.
func (b *browser) call(session, method string, params any) (json.RawMessage, error) {
	if params == nil {
		params = map[string]any{}
	}
	ch := make(chan cdpReply, 1)
	b.mu.Lock()
	b.next++
	id := b.next
	b.pending[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method, "params": params}
	if session != "" {
		msg["sessionId"] = session
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	if _, err := b.w.Write(append(data, 0)); err != nil {
		return nil, fmt.Errorf("%s: write: %w", method, err)
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("%s: chromium closed the pipe", method)
		}
		if m.Error != nil {
			return nil, fmt.Errorf("%s: %d %s", method, m.Error.Code, m.Error.Message)
		}
		return m.Result, nil
	case <-b.exited:
		return nil, fmt.Errorf("%s: chromium exited", method)
	case <-time.After(cdpCallTimeout):
		return nil, fmt.Errorf("%s: no reply in %v", method, cdpCallTimeout)
	}
}

func (b *browser) must(t *testing.T, session, method string, params, out any) {
	t.Helper()
	res, err := b.call(session, method, params)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(res, out); err != nil {
			t.Fatalf("%s: %v", method, err)
		}
	}
}

func (b *browser) resize(t *testing.T, w, h int) {
	b.must(t, b.session, "Emulation.setDeviceMetricsOverride",
		map[string]any{"width": w, "height": h, "deviceScaleFactor": 1, "mobile": false}, nil)
}

// eval runs expression in the page (awaiting a promise) and decodes its
// value into out (nil: ignored).
func (b *browser) eval(expression string, out any) error {
	res, err := b.call(b.session, "Runtime.evaluate", map[string]any{"expression": expression,
		"awaitPromise": true, "returnByValue": true})
	if err != nil {
		return err
	}
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return err
	}
	if e := r.ExceptionDetails; e != nil {
		return errors.New(e.Text + " " + e.Exception.Description)
	}
	if out != nil && len(r.Result.Value) > 0 {
		return json.Unmarshal(r.Result.Value, out)
	}
	return nil
}

// do runs statements in the page (a click, a form filled in).
func (b *browser) do(t *testing.T, what, js string) {
	t.Helper()
	if err := b.eval("(() => {"+js+"})()", nil); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitFor waits, in the page, until the expression is truthy (the page
// polls and re-renders every few seconds), and returns its value as text.
func (b *browser) waitFor(t *testing.T, what, expression string, timeout time.Duration) string {
	t.Helper()
	js := fmt.Sprintf(`new Promise((resolve, reject) => {
  const until = Date.now() + %d;
  const probe = () => { try { return (%s); } catch (e) { return undefined; } };
  (function loop() {
    const v = probe();
    if (v) return resolve(String(v));
    if (Date.now() > until) return reject(new Error("timed out"));
    setTimeout(loop, 50);
  })();
})`, timeout.Milliseconds(), expression)
	var v string
	if err := b.eval(js, &v); err != nil {
		// What the page showed instead, for whoever reads the failure.
		if os.MkdirAll(artifactsDir, 0o755) == nil {
			shot := filepath.Join(artifactsDir, "failed.png")
			b.screenshot(t, shot)
			t.Logf("the page as it was: %s", shot)
		}
		t.Fatalf("dashboard never showed %s (%s): %v\npage errors: %v", what, expression, err, b.pageErrors())
	}
	return v
}

func (b *browser) navigate(t *testing.T, url string) {
	t.Helper()
	b.must(t, b.session, "Page.navigate", map[string]any{"url": url}, nil)
}

func (b *browser) pageErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errs...)
}

// screenshot writes the whole page (not just the window) as a PNG.
func (b *browser) screenshot(t *testing.T, path string) {
	t.Helper()
	var m struct {
		CSSContentSize struct {
			Width, Height float64
		} `json:"cssContentSize"`
	}
	b.must(t, b.session, "Page.getLayoutMetrics", nil, &m)
	var shot struct {
		Data string `json:"data"`
	}
	b.must(t, b.session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true,
		"clip": map[string]any{"x": 0, "y": 0, "width": m.CSSContentSize.Width, "height": m.CSSContentSize.Height, "scale": 1}}, &shot)
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
}
