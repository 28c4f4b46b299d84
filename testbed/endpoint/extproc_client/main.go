// Command extproc-client plays Envoy's side of the ext_proc stream to an endpoint picker (EPP) and
// prints the endpoint it picks: what the test bed uses in place of Envoy (none can be had here), so
// the picker's own gRPC server, scheduler and datastore answer a request as they would in a gateway.
//
// Each request opens one ProcessRequest stream, as Envoy's ext_proc filter does per HTTP request:
// request headers (:method, :path, content-type; end_of_stream false), then the JSON body in two
// chunks, the last with end_of_stream (the picker buffers until then, as it does under Envoy AI
// Gateway's FULL_DUPLEX_STREAMED mode). The picker answers the headers only after the body, with a
// header mutation and dynamic metadata (namespace envoy.lb) both naming the endpoint. One JSON line
// per request on stdout:
//
//	{"header": "10.244.0.7:8000", "metadata": "10.244.0.7:8000"}
//	{"immediate": 503, "body": "..."}     (the picker refused: no endpoint, or an error)
//
// TLS without verification by default, as Envoy AI Gateway v1.0 connects to the picker (the EPP
// serves a self-signed certificate unless --secure-serving=false); -plaintext for h2c.
//
// With -serve it is instead the stand-in for the gateway's data plane (gateway.go).
//
// For the picker benchmark (testbed/e2e/real_picker.py) it also plays Envoy's last hop: with
// -forward it sends each request, streamed, to the endpoint picked, as Envoy's original-destination
// cluster would; with -endpoints it skips the picker and sends round-robin over the list (the
// baseline). -c requests run at once. Each line then also has the endpoint that answered, its HTTP
// status and, in milliseconds from the request's start, the pick, the first streamed token and the end:
//
//	{"header": "10.244.0.7:8000", ..., "endpoint": "10.244.0.7:8000", "status": 200, "pick_ms": 3.1, "ttft_ms": 58.2, "total_ms": 221.0}
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// The names the EPP answers with (GAIE pkg/epp/metadata: DestinationEndpointKey, DestinationEndpointNamespace).
const (
	endpointKey       = "x-gateway-destination-endpoint"
	endpointNamespace = "envoy.lb"
)

type pick struct {
	Header    string `json:"header,omitempty"`
	Metadata  string `json:"metadata,omitempty"`
	Immediate int    `json:"immediate,omitempty"`
	Body      string `json:"body,omitempty"`
	// Set when the request is sent on (-forward, -endpoints).
	Endpoint string  `json:"endpoint,omitempty"`
	Status   int     `json:"status,omitempty"`
	PickMs   float64 `json:"pick_ms,omitempty"`
	TTFTMs   float64 `json:"ttft_ms,omitempty"`
	TotalMs  float64 `json:"total_ms,omitempty"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:9002", "the picker's ext_proc address (host:port)")
	plaintext := flag.Bool("plaintext", false, "h2c instead of TLS (for an EPP run with --secure-serving=false)")
	model := flag.String("model", "", "the body's model (required)")
	path := flag.String("path", "/v1/completions", "the request's :path")
	count := flag.Int("n", 1, "requests to send, one stream each, one line each")
	timeout := flag.Duration("timeout", 10*time.Second, "per request")
	forward := flag.Bool("forward", false, "send each request, streamed, to the endpoint picked")
	endpoints := flag.String("endpoints", "", "host:port,...: no picker; send round-robin over these")
	concurrency := flag.Int("c", 1, "requests at once")
	maxTokens := flag.Int("max-tokens", 4, "the body's max_tokens")
	serveConfig := flag.String("serve", "", "a JSON file: serve as the gateway's data plane instead (gateway.go)")
	listen := flag.String("listen", "127.0.0.1:8088", "with -serve: the address to listen on")
	flag.Parse()
	if *serveConfig != "" {
		if err := serve(*serveConfig, *listen); err != nil {
			fmt.Fprintf(os.Stderr, "ERROR: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if *model == "" {
		fmt.Fprintln(os.Stderr, "ERROR: -model is required (the body's model)")
		os.Exit(2)
	}
	var client extprocv3.ExternalProcessorClient
	var targets []string
	if *endpoints != "" {
		targets = strings.Split(*endpoints, ",")
	} else {
		creds := credentials.NewTLS(tlsNoVerify())
		if *plaintext {
			creds = insecure.NewCredentials()
		}
		conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			fmt.Fprintf(os.Stderr, "ERROR: cannot dial %s: %v\n", *addr, err)
			os.Exit(1)
		}
		defer conn.Close()
		client = extprocv3.NewExternalProcessorClient(conn)
	}
	send := *forward || len(targets) > 0
	// Envoy keeps its upstream connections open; so does this, enough of them for -c at once.
	httpClient := &http.Client{Timeout: *timeout, Transport: &http.Transport{MaxIdleConnsPerHost: *concurrency}}
	var mu sync.Mutex
	var failed error
	out := json.NewEncoder(os.Stdout)
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < *concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				body := requestBody(*model, *maxTokens, send)
				start := time.Now()
				var p pick
				var err error
				if len(targets) > 0 {
					p.Endpoint = targets[i%len(targets)]
				} else if p, err = request(client, *path, body, *timeout); err == nil && send && p.Immediate == 0 {
					p.Endpoint = p.Header
				}
				if err == nil && p.Endpoint != "" {
					p.PickMs = ms(time.Since(start))
					err = forwardTo(httpClient, p.Endpoint, *path, body, start, &p)
				}
				mu.Lock()
				if err != nil && failed == nil {
					failed = fmt.Errorf("request %d: %w", i, err)
				}
				if err == nil {
					_ = out.Encode(p)
				}
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < *count; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if failed != nil {
		fmt.Fprintf(os.Stderr, "ERROR: %v (picker %s)\n", failed, *addr)
		os.Exit(1)
	}
}

// tlsNoVerify is how Envoy AI Gateway v1.0 connects to the picker, whose certificate is self-signed.
func tlsNoVerify() *tls.Config { return &tls.Config{InsecureSkipVerify: true} } //nolint:gosec // as above

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// requestBody is a prompt of its own per request: a repeated one would earn the pod that had it a
// prefix-cache score, and the pick would follow that rather than the metrics under test.
func requestBody(model string, maxTokens int, stream bool) []byte {
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	fields := map[string]any{"model": model, "prompt": fmt.Sprintf("%x: which pod answers?", nonce), "max_tokens": maxTokens}
	if stream {
		// ignore_eos: exactly max_tokens tokens, so every request of a run is the same work.
		fields["stream"], fields["ignore_eos"] = true, true
	}
	body, _ := json.Marshal(fields)
	return body
}

// forwardTo sends the request to the endpoint and reads its stream: the first data line is the
// first token's time, the end of the body the total.
func forwardTo(client *http.Client, endpoint, path string, body []byte, start time.Time, p *pick) error {
	resp, err := client.Post("http://"+endpoint+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	p.Status = resp.StatusCode
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		// vLLM (and its simulators) report an error met after the 200 as a data line of its own.
		if line := lines.Text(); strings.HasPrefix(line, `data: {"error"`) {
			return fmt.Errorf("%s streamed an error: %s", endpoint, strings.TrimPrefix(line, "data: "))
		} else if p.TTFTMs == 0 && strings.HasPrefix(line, "data: ") {
			p.TTFTMs = ms(time.Since(start))
		}
	}
	if err := lines.Err(); err != nil {
		return err
	}
	p.TotalMs = ms(time.Since(start))
	if p.Status != http.StatusOK {
		return fmt.Errorf("%s answered %d", endpoint, p.Status)
	}
	return nil
}

func request(client extprocv3.ExternalProcessorClient, path string, body []byte, timeout time.Duration) (pick, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stream, err := client.Process(ctx)
	if err != nil {
		return pick{}, err
	}
	headers := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")},
			{Key: ":path", RawValue: []byte(path)},
			{Key: ":authority", RawValue: []byte("endpoint.test")},
			{Key: "content-type", RawValue: []byte("application/json")},
			{Key: "content-length", RawValue: []byte(fmt.Sprint(len(body)))},
		}}},
	}}
	half := len(body) / 2
	messages := []*extprocv3.ProcessingRequest{headers, bodyChunk(body[:half], false), bodyChunk(body[half:], true)}
	for _, m := range messages {
		if err := stream.Send(m); err != nil {
			return pick{}, err
		}
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return pick{}, errors.New("the picker closed the stream without answering the request headers")
		}
		if err != nil {
			return pick{}, err
		}
		if imm := resp.GetImmediateResponse(); imm != nil {
			_ = stream.CloseSend()
			return pick{Immediate: int(imm.GetStatus().GetCode()), Body: string(imm.GetBody())}, nil
		}
		if hr := resp.GetRequestHeaders(); hr != nil {
			p := pick{}
			for _, h := range hr.GetResponse().GetHeaderMutation().GetSetHeaders() {
				if h.GetHeader().GetKey() == endpointKey {
					p.Header = string(h.GetHeader().GetRawValue())
				}
			}
			if ns := resp.GetDynamicMetadata().GetFields()[endpointNamespace]; ns != nil {
				p.Metadata = ns.GetStructValue().GetFields()[endpointKey].GetStringValue()
			}
			// Envoy would now send the request upstream; ending the stream here is a client reset of it.
			_ = stream.CloseSend()
			return p, nil
		}
	}
}

func bodyChunk(data []byte, last bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: data, EndOfStream: last},
	}}
}
