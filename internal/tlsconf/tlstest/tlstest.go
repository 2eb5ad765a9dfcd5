// Package tlstest makes certificate authorities and certificates for tests and
// benchmarks, with crypto/x509, written as PEM files into the test's temporary directory.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TB is what the package needs of a test: testing.TB has it. Fatal is called only when
// crypto/rand or the temporary directory fails.
type TB interface {
	Helper()
	Fatal(args ...any)
	TempDir() string
}

// CA is a certificate authority of a test.
type CA struct {
	Name     string
	CertFile string // the CA certificate, PEM
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	dir      string
}

// NewCA makes a self-signed CA named name.
func NewCA(tb TB, name string) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(tb),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	ca := &CA{Name: name, cert: cert, key: key, dir: tb.TempDir()}
	ca.CertFile = filepath.Join(ca.dir, name+"-ca.crt")
	writePEM(tb, ca.CertFile, "CERTIFICATE", der)
	return ca
}

// Pool returns a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Cert is an issued certificate and its key, as files and loaded.
type Cert struct {
	CertFile, KeyFile string
	TLS               tls.Certificate
}

// Issue makes a certificate for common name cn, valid for both server and client
// authentication, for hosts (IP addresses or DNS names; default 127.0.0.1 and
// localhost).
func (ca *CA) Issue(tb TB, cn string, hosts ...string) Cert {
	tb.Helper()
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1", "localhost"}
	}
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: serial(tb),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	c := Cert{CertFile: filepath.Join(dir, cn+".crt"), KeyFile: filepath.Join(dir, cn+".key")}
	writePEM(tb, c.CertFile, "CERTIFICATE", der)
	writePEM(tb, c.KeyFile, "PRIVATE KEY", kb)
	if c.TLS, err = tls.LoadX509KeyPair(c.CertFile, c.KeyFile); err != nil {
		tb.Fatal(err)
	}
	return c
}

// ClientConfig returns a client config that trusts ca and presents certs.
func (ca *CA) ClientConfig(certs ...Cert) *tls.Config {
	c := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	for _, cert := range certs {
		c.Certificates = append(c.Certificates, cert.TLS)
	}
	return c
}

func newKey(tb TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return key
}

func serial(tb TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func writePEM(tb TB, file, typ string, der []byte) {
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}
