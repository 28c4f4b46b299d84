// The -serve mode: a stand-in for the gateway's data plane (Envoy, as Envoy Gateway and Envoy AI
// Gateway configure it), so the test bed can send a request through one team's URL. None of those
// can be built here (docs/endpoint.md); this does, per request, what their documented configuration
// for the stack's objects makes Envoy do, and nothing more:
//
//   - the Host chooses the team's route (AIGatewayRoute hostnames); no route: 404, empty body;
//   - the API key (SecurityPolicy apiKeyAuth: `Authorization: Bearer <key>` against the team's
//     Secret) or a local 401; the header is removed before the request goes on (sanitize);
//   - GET /v1/models: the models of the host's routes (AI Gateway's models processor, per host);
//   - otherwise the body's `model` chooses the rule (x-ai-eg-model); none: AI Gateway's 404;
//   - the rule's InferencePool's picker is asked over ext_proc, as Envoy's filter asks it; its
//     immediate response is answered as it is; else the request goes to the pod it names
//     (original destination) and the answer is streamed back as it arrives, chunk by chunk;
//   - the gateway's own answers (401, 404, 429) are replaced by the team's BackendTrafficPolicy
//     responseOverride entries of source Local.
//
// What it reads is the translation the test bed makes of the objects in the API server
// (testbed/endpoint/standin_gateway.py), a JSON file re-read whenever it changes (Envoy Gateway
// pushing new credentials after a key rotation). It adds one response header of its own,
// x-gs-standin-endpoint, naming the pod that answered, so a check can tell which pool served.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

const standinEndpointHeader = "x-gs-standin-endpoint"

type gatewayConfig struct {
	Hosts map[string]*hostConfig `json:"hosts"`
}

type hostConfig struct {
	Keys      []string                 `json:"keys"`
	Models    []modelRoute             `json:"models"`
	Overrides map[string]localOverride `json:"overrides"`
}

type modelRoute struct {
	Name           string  `json:"name"`
	Picker         string  `json:"picker"`
	TimeoutSeconds float64 `json:"timeoutSeconds"`
}

type localOverride struct {
	ContentType string `json:"contentType"`
	Body        string `json:"body"`
}

type gateway struct {
	path    string
	mu      sync.Mutex
	mtime   time.Time
	config  *gatewayConfig
	pickers map[string]extprocv3.ExternalProcessorClient
}

func serve(path, listen string) error {
	g := &gateway{path: path, pickers: map[string]extprocv3.ExternalProcessorClient{}}
	if _, err := g.current(); err != nil {
		return err
	}
	listener, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	log.Printf("serving %s on %s", path, listener.Addr())
	server := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second}
	return server.Serve(listener)
}

// current re-reads the file when its modification time changed.
func (g *gateway) current() (*gatewayConfig, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	info, err := os.Stat(g.path)
	if err != nil {
		return nil, err
	}
	if g.config != nil && info.ModTime().Equal(g.mtime) {
		return g.config, nil
	}
	raw, err := os.ReadFile(g.path)
	if err != nil {
		return nil, err
	}
	var c gatewayConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", g.path, err)
	}
	g.config, g.mtime = &c, info.ModTime()
	log.Printf("config loaded: %d hosts", len(c.Hosts))
	return g.config, nil
}

func (g *gateway) picker(addr string) (extprocv3.ExternalProcessorClient, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c, ok := g.pickers[addr]; ok {
		return c, nil
	}
	// As Envoy AI Gateway v1.0 connects to the picker: TLS, its certificate not verified.
	creds := credentials.NewTLS(tlsNoVerify())
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	c := extprocv3.NewExternalProcessorClient(conn)
	g.pickers[addr] = c
	return c, nil
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	config, err := g.current()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	hc := config.Hosts[host]
	if hc == nil {
		// No route of any team: Envoy's 404 of a virtual host without routes, no policy applies.
		w.WriteHeader(http.StatusNotFound)
		return
	}
	// No SecurityPolicy on the route (keys null): Envoy checks nothing; an empty list admits nobody.
	if hc.Keys != nil {
		key, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !found || !contains(hc.Keys, key) {
			hc.local(w, http.StatusUnauthorized, "Client authentication failed.")
			return
		}
		r.Header.Del("Authorization")
	}
	if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
		hc.models(w)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var fields struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &fields)
	route := hc.route(fields.Model)
	if route == nil || r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/v1/") {
		// AI Gateway's last rule of the generated HTTPRoute.
		hc.local(w, http.StatusNotFound, "No matching route found. It is likely because the model specified in your request is not configured in the Gateway.")
		return
	}
	timeout := time.Duration(route.TimeoutSeconds * float64(time.Second))
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	client, err := g.picker(route.Picker)
	if err != nil {
		hc.local(w, http.StatusInternalServerError, err.Error())
		return
	}
	p, err := request(client, r.URL.Path, body, timeout)
	if err != nil {
		// The pool's picker is FailClose: no pick, no request.
		hc.local(w, http.StatusInternalServerError, fmt.Sprintf("endpoint picker %s: %v", route.Picker, err))
		return
	}
	if p.Immediate != 0 {
		hc.local(w, p.Immediate, p.Body)
		return
	}
	if p.Header == "" {
		hc.local(w, http.StatusInternalServerError, "the picker named no endpoint")
		return
	}
	proxy(w, r, p.Header, body, timeout)
}

func (hc *hostConfig) route(model string) *modelRoute {
	for i := range hc.Models {
		if hc.Models[i].Name == model {
			return &hc.Models[i]
		}
	}
	return nil
}

func (hc *hostConfig) models(w http.ResponseWriter) {
	type entry struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []entry `json:"data"`
	}{Object: "list", Data: []entry{}}
	for _, m := range hc.Models {
		list.Data = append(list.Data, entry{ID: m.Name, Object: "model", OwnedBy: "Envoy AI Gateway"})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// local answers as Envoy does itself: the policy's override for the status if it has one, else plain text.
func (hc *hostConfig) local(w http.ResponseWriter, status int, text string) {
	if o, ok := hc.Overrides[fmt.Sprint(status)]; ok {
		w.Header().Set("Content-Type", o.ContentType)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, o.Body)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, text)
}

// proxy sends the request to the picked pod and copies the answer back, flushing each read: a
// streamed completion reaches the client token by token, not when it ends.
func proxy(w http.ResponseWriter, r *http.Request, endpoint string, body []byte, timeout time.Duration) {
	upstream, err := http.NewRequestWithContext(r.Context(), r.Method, "http://"+endpoint+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	for _, h := range []string{"Content-Type", "Accept"} {
		if v := r.Header.Get(h); v != "" {
			upstream.Header.Set(h, v)
		}
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(upstream)
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.Header().Set(standinEndpointHeader, endpoint)
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			log.Printf("%s: %v", endpoint, err)
			return
		}
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
