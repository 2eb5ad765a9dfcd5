package fence

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseHeaderValid(t *testing.T) {
	maxLock := strings.Repeat("a", MaxLockLen)
	for _, tc := range []struct {
		in    string
		lock  string
		token uint64
	}{
		{"orders/42=34", "orders/42", 34},
		{"a=1", "a", 1},
		{"A.b_c-d/e:f@g+h=9", "A.b_c-d/e:f@g+h", 9},
		{"x=18446744073709551615", "x", math.MaxUint64},
		{maxLock + "=18446744073709551615", maxLock, math.MaxUint64},
	} {
		lock, token, err := ParseHeader(tc.in)
		if err != nil {
			t.Errorf("ParseHeader(%q): %v", tc.in, err)
			continue
		}
		if lock != tc.lock || token != tc.token {
			t.Errorf("ParseHeader(%q) = %q, %d; want %q, %d", tc.in, lock, token, tc.lock, tc.token)
		}
		if got := FormatHeader(lock, token); got != tc.in {
			t.Errorf("FormatHeader(%q, %d) = %q; want %q", lock, token, got, tc.in)
		}
	}
}

func TestParseHeaderMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string // want: a substring of the error message
	}{
		{"empty", "", "value is empty"},
		{"missing equals", "orders/42", "missing '='"},
		{"only equals", "=", "lock name is empty"},
		{"empty lock", "=5", "lock name is empty"},
		{"empty token", "orders/42=", "token is empty"},
		{"negative", "orders/42=-1", `token "-1" is not a positive integer`},
		{"plus sign", "orders/42=+1", `token "+1" is not a positive integer`},
		{"non-numeric", "orders/42=abc", `token "abc" is not a positive integer`},
		{"hex", "orders/42=0x10", `token "0x10" is not a positive integer`},
		{"float", "orders/42=1.5", `token "1.5" is not a positive integer`},
		{"zero", "orders/42=0", "token 0 is never issued"},
		{"leading zero", "orders/42=007", `token "007" has leading zeros`},
		{"overflow", "orders/42=18446744073709551616", "larger than 18446744073709551615"},
		{"second equals", "orders/42=1=2", `token "1=2" is not a positive integer`},
		{"space in lock", "orders 42=1", "lock name has byte ' ' at offset 6"},
		{"space before token", "orders/42= 1", `token " 1" is not a positive integer`},
		{"trailing space", "orders/42=1 ", `token "1 " is not a positive integer`},
		{"control char", "orders\x00=1", `lock name has byte '\x00'`},
		{"newline", "orders\n=1", `lock name has byte '\n'`},
		{"comma list", "a=1, b=2", `token "1, b=2" is not a positive integer`},
		{"non-ascii lock", "ordérs=1", "lock name has byte"},
		{"long lock", strings.Repeat("a", MaxLockLen+1) + "=1", "lock name is 257 bytes, the limit is 256"},
		{"oversized", strings.Repeat("a", 200) + "=" + strings.Repeat("1", 100), "value is 301 bytes, the limit is 300"},
		{"huge", strings.Repeat("x", 1<<20), "value is 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lock, token, err := ParseHeader(tc.in)
			if err == nil {
				t.Fatalf("ParseHeader(%q) = %q, %d, nil; want an error", tc.in, lock, token)
			}
			if !errors.Is(err, ErrMalformedToken) {
				t.Errorf("error %v does not wrap ErrMalformedToken", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if lock != "" || token != 0 {
				t.Errorf("ParseHeader returned %q, %d with an error; want zero values", lock, token)
			}
		})
	}
}

func FuzzParseHeader(f *testing.F) {
	for _, s := range []string{"orders/42=34", "a=1", "=", "", "a=0", "a=-1", "a=18446744073709551616",
		"a=18446744073709551615", "a==1", "a=01", "a b=1", "\xff=1", "a=1\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		lock, token, err := ParseHeader(v)
		if err != nil {
			if !errors.Is(err, ErrMalformedToken) {
				t.Fatalf("ParseHeader(%q): error %v does not wrap ErrMalformedToken", v, err)
			}
			return
		}
		// A valid value is canonical: formatting it back gives the same bytes.
		if got := FormatHeader(lock, token); got != v {
			t.Fatalf("FormatHeader(ParseHeader(%q)) = %q", v, got)
		}
		if token == 0 || lock == "" || len(lock) > MaxLockLen || strings.Contains(lock, "=") {
			t.Fatalf("ParseHeader(%q) accepted lock %q token %d", v, lock, token)
		}
		if err := checkFence(lock, token); err != nil {
			t.Fatalf("checkFence rejects what ParseHeader accepted (%q): %v", v, err)
		}
	})
}
