package verify

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"

	"github.com/leasehold/leasehold/fence"
)

// DemoResource returns an HTTP resource to point Run at: it takes the writers' POSTs and
// keeps the last body, which a GET returns. Unfenced, it accepts every write, as a service that knows nothing
// of fencing tokens does, and Run must fail it. Fenced, it admits each write through a
// fence.Memory guard (package fence's Middleware: 409 for a stale token, 428 without
// one) and applies it under the same mutex as the check, so no admitted write can land
// after a newer one; Run must pass it. `leasehold demo-resource` serves it.
func DemoResource(fenced bool) http.Handler {
	var mu sync.Mutex
	var last []byte
	store := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(last)
			return
		case http.MethodPost:
		default:
			http.Error(w, "POST a write, or GET the last one", http.StatusMethodNotAllowed)
			return
		}
		b, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		last = b
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"stored": len(b)})
	})
	var h http.Handler = store
	if fenced {
		guarded := fence.Middleware(fence.NewMemory())(store)
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				store.ServeHTTP(w, r) // reads need no token
				return
			}
			guarded.ServeHTTP(w, r)
		})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock() // check and write as one step, and last stays consistent
		defer mu.Unlock()
		h.ServeHTTP(w, r)
	})
}
