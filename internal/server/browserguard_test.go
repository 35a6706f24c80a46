package server

import (
	"net/http/httptest"
	"testing"
)

func TestHostAllowed(t *testing.T) {
	f := &Front{cfg: FrontConfig{ProxyDomain: "sbx.example.com", PublicURL: "https://sbx.corp.test:8443"}}
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"127.0.0.1:7777", true},
		{"[::1]:7777", true},
		{"10.1.2.3", true},
		{"localhost:7777", true},
		{"LOCALHOST.:7777", true},
		{"app.localhost:7777", true},
		{"sbx.example.com:7777", true},
		{"8000-sb-x.sbx.example.com", true},
		{"sbx.corp.test:8443", true},
		{"", true},
		{"evil.test:7777", false},
		{"localhost.evil.test:7777", false},
		{"127.0.0.1.evil.test", false},
		{"sbx.example.com.evil.test", false},
		{"xsbx.example.com", false},
	} {
		if got := f.hostAllowed(tc.host); got != tc.want {
			t.Errorf("hostAllowed(%q): got %v, want %v", tc.host, got, tc.want)
		}
	}
}

func TestSameOriginPage(t *testing.T) {
	for _, tc := range []struct {
		name         string
		origin, site string
		fromPage     bool
		same         bool
	}{
		{"cli", "", "", false, true},
		{"typed url", "", "none", false, true},
		{"own page", "http://127.0.0.1:7778", "same-origin", true, true},
		{"own page, no fetch metadata", "http://127.0.0.1:7778", "", true, true},
		{"other port", "http://127.0.0.1:7777", "same-site", true, false},
		{"other site", "http://evil.test", "cross-site", true, false},
		{"opaque", "null", "cross-site", true, false},
		{"same-site claim without origin", "", "same-site", true, false},
		{"origin with other port, claimed same-origin", "http://127.0.0.1:7777", "same-origin", true, false},
	} {
		r := httptest.NewRequest("GET", "http://127.0.0.1:7778/sbx.v1.SandboxService/ListSandboxes", nil)
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if tc.site != "" {
			r.Header.Set("Sec-Fetch-Site", tc.site)
		}
		if got := fromPage(r); got != tc.fromPage {
			t.Errorf("%s: fromPage got %v, want %v", tc.name, got, tc.fromPage)
		}
		if got := sameOriginPage(r); got != tc.same {
			t.Errorf("%s: sameOriginPage got %v, want %v", tc.name, got, tc.same)
		}
	}
}
