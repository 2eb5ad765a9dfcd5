// Package ui is leasehold's web dashboard: one HTML page, one script and one style
// sheet, written by hand (no framework, no external scripts or fonts) and embedded in
// the binary. Every node serves it at /ui (server.Server.Handler mounts Handler). The
// page reads the node it was loaded from with Connect's JSON protocol, exactly as any
// other client: LockService.List (or Watch, when the node serves it) for the lock
// table and the event feed, ClusterService.Status and Members for the cluster,
// LockService.Describe (and History, when served) for one lock. It therefore shows only
// what the caller may read: with auth on, the page asks for a bearer token, keeps it in
// the tab's sessionStorage and sends it as "Authorization: Bearer"; a refused call is
// shown as "not allowed" with the server's message. The assets carry no data, so they
// are served to everyone.
package ui

import (
	"embed"
	"encoding/json"
	"net/http"
	"slices"
)

//go:embed assets/index.html assets/app.js assets/app.css
var assets embed.FS

// Config is what the page needs to know about the node that serves it. The zero value
// is a node without auth.
type Config struct {
	// Auth says that callers must bring a bearer token: the page asks for one before
	// it calls anything.
	Auth bool `json:"auth"`
	// Procedures are the Connect procedures the node serves
	// ("/leasehold.v1.LockService/List", …). The page uses the optional ones (Watch,
	// History) only when they are listed, so an older node never sees a call it would
	// answer 404.
	Procedures []string `json:"procedures"`
}

// Handler serves the dashboard: the page at /ui and /ui/, its assets under /ui/, and
// /ui/config.json (cfg, for the page). Any other path under /ui/ is 404. Every answer
// carries a Content-Security-Policy that allows scripts, styles and connections from
// this origin only.
func Handler(cfg Config) http.Handler {
	cfg.Procedures = slices.Clone(cfg.Procedures)
	config, err := json.Marshal(cfg)
	if err != nil {
		panic(err) // a struct of a bool and strings always marshals
	}
	files := map[string]struct{ name, contentType string }{
		"/ui":         {"assets/index.html", "text/html; charset=utf-8"},
		"/ui/":        {"assets/index.html", "text/html; charset=utf-8"},
		"/ui/app.js":  {"assets/app.js", "text/javascript; charset=utf-8"},
		"/ui/app.css": {"assets/app.css", "text/css; charset=utf-8"},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path == "/ui/config.json" {
			h.Set("Content-Type", "application/json")
			_, _ = w.Write(config)
			return
		}
		f, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		b, err := assets.ReadFile(f.name)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		h.Set("Content-Type", f.contentType)
		_, _ = w.Write(b)
	})
}
