package tlsconf_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/tlsconf"
	"github.com/leasehold/leasehold/internal/tlsconf/tlstest"
)

// TestLoadChecksWhatGoesTogether checks the combinations Load refuses, each naming the
// flags, and that a CA shared by clients and nodes is refused (a client certificate
// would pass for a node).
func TestLoadChecksWhatGoesTogether(t *testing.T) {
	ca := tlstest.NewCA(t, "ca")
	c := ca.Issue(t, "n1")
	for _, tc := range []struct {
		api, peer tlsconf.Files
		want      string
	}{
		{tlsconf.Files{Cert: c.CertFile}, tlsconf.Files{}, "--tls-cert and --tls-key"},
		{tlsconf.Files{CA: ca.CertFile}, tlsconf.Files{}, "--tls-client-ca needs --tls-cert"},
		{tlsconf.Files{}, tlsconf.Files{Cert: c.CertFile, Key: c.KeyFile}, "--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together"},
		{tlsconf.Files{Cert: c.CertFile, Key: c.KeyFile, CA: ca.CertFile}, tlsconf.Files{Cert: c.CertFile, Key: c.KeyFile, CA: ca.CertFile}, "use a CA of their own for the nodes"},
		{tlsconf.Files{Cert: c.CertFile, Key: c.CertFile}, tlsconf.Files{}, "certificate"},
		{tlsconf.Files{Cert: c.CertFile, Key: c.KeyFile, CA: c.KeyFile}, tlsconf.Files{}, "holds no PEM certificate"},
	} {
		_, err := tlsconf.Load(tc.api, tc.peer)
		if !errors.Is(err, tlsconf.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v %+v: %v, want ErrConfig containing %q", tc.api, tc.peer, err, tc.want)
		}
	}
	if _, err := tlsconf.Load(tlsconf.Files{Cert: c.CertFile, Key: c.KeyFile, CA: tlstest.NewCA(t, "clients").CertFile}, tlsconf.Files{Cert: c.CertFile, Key: c.KeyFile, CA: ca.CertFile}); err != nil {
		t.Errorf("a valid configuration: %v", err)
	}
}
