package ui

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHandler checks what /ui serves: the page at /ui and /ui/, its two assets with
// their content types, the page's config, 404 for anything else; a policy that allows
// only this origin on every answer.
func TestHandler(t *testing.T) {
	h := Handler(Config{Auth: true, Procedures: []string{"/leasehold.v1.LockService/List"}})
	for _, c := range []struct {
		path, contentType, contains string
		status                      int
	}{
		{"/ui", "text/html; charset=utf-8", `<script src="/ui/app.js"`, http.StatusOK},
		{"/ui/", "text/html; charset=utf-8", `<link rel="stylesheet" href="/ui/app.css">`, http.StatusOK},
		{"/ui/app.js", "text/javascript; charset=utf-8", `"use strict";`, http.StatusOK},
		{"/ui/app.css", "text/css; charset=utf-8", "body {", http.StatusOK},
		{"/ui/config.json", "application/json", `"auth":true`, http.StatusOK},
		{"/ui/index.html", "text/plain; charset=utf-8", "404", http.StatusNotFound},
		{"/ui/assets/app.js", "text/plain; charset=utf-8", "404", http.StatusNotFound},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, c.path, nil))
		body, _ := io.ReadAll(rec.Body)
		if rec.Code != c.status || rec.Header().Get("Content-Type") != c.contentType || !strings.Contains(string(body), c.contains) {
			t.Errorf("GET %s: %d %q, want %d %q containing %q", c.path, rec.Code, rec.Header().Get("Content-Type"), c.status, c.contentType, c.contains)
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", c.path, csp)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/config.json", nil))
	var got Config
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || !got.Auth || len(got.Procedures) != 1 {
		t.Errorf("config.json: %s (%v)", rec.Body, err)
	}
}

// TestAssetsSelfContained checks that the page loads nothing from elsewhere: no
// absolute URL in a src, href or url(), no import, no external font.
func TestAssetsSelfContained(t *testing.T) {
	for _, name := range []string{"assets/index.html", "assets/app.js", "assets/app.css"} {
		b, err := assets.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"http://", "https://", "//cdn", "@import", "@font-face", "import(", "<script src=\"http"} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s contains %q", name, bad)
			}
		}
	}
}
