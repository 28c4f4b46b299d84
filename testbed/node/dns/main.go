// A stand-in for cluster DNS on the real node (testbed/node/join.py), said to be one: it answers A
// queries for <service>.<namespace>.svc.<domain> with the Service's ClusterIP, and for
// <hostname>.<subdomain>.<namespace>.svc.<domain> with the address of the pod of that hostname in the
// Endpoints of the headless Service named by the subdomain (as LeaderWorkerSet's leader address is),
// read from the API server with the kubelet's credentials (a node may read Services and Endpoints), and
// NXDOMAIN for anything else. Standard library only, UDP only, no caching beyond a few seconds, no
// SRV, no records of a headless Service's name itself, no upstream: what CoreDNS does beyond that is
// not shown by the checks using it.
//
//	gs-dns -listen 10.0.2.15:53 -server https://127.0.0.1:6443 -ca ca.crt -cert kubelet.crt -key kubelet.key
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

const ttl = 5

type resolver struct {
	client *http.Client
	server string
	domain string
}

// read: the API server's JSON at path decoded into into; false when it has no such object (404).
func (r *resolver) read(path string, into any) (bool, error) {
	resp, err := r.client.Get(r.server + path)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return false, nil
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("API server answered %s", resp.Status)
	}
	return true, json.NewDecoder(resp.Body).Decode(into)
}

// clusterIP: the Service's address, nil when there is none (NXDOMAIN), an error when the API server did not answer.
func (r *resolver) clusterIP(service, namespace string) (net.IP, error) {
	var svc struct {
		Spec struct {
			ClusterIP string `json:"clusterIP"`
		} `json:"spec"`
	}
	found, err := r.read(fmt.Sprintf("/api/v1/namespaces/%s/services/%s", namespace, service), &svc)
	if !found || err != nil {
		return nil, err
	}
	return net.ParseIP(svc.Spec.ClusterIP).To4(), nil
}

// podIP: the address of the pod of that hostname under the headless Service named by the subdomain, from that
// Service's Endpoints (what CoreDNS answers for a pod of a headless Service; a node may read Endpoints, not list
// pods), nil when there is none yet.
func (r *resolver) podIP(hostname, subdomain, namespace string) (net.IP, error) {
	type address struct {
		IP       string `json:"ip"`
		Hostname string `json:"hostname"`
	}
	var endpoints struct {
		Subsets []struct {
			Addresses         []address `json:"addresses"`
			NotReadyAddresses []address `json:"notReadyAddresses"`
		} `json:"subsets"`
	}
	found, err := r.read(fmt.Sprintf("/api/v1/namespaces/%s/endpoints/%s", namespace, subdomain), &endpoints)
	if !found || err != nil {
		return nil, err
	}
	for _, subset := range endpoints.Subsets {
		for _, a := range append(subset.Addresses, subset.NotReadyAddresses...) {
			if a.Hostname == hostname {
				return net.ParseIP(a.IP).To4(), nil
			}
		}
	}
	return nil, nil
}

// question: the first question's name (lower case, no trailing dot), type, and where it ends.
func question(msg []byte) (string, uint16, int, bool) {
	if len(msg) < 12 || binary.BigEndian.Uint16(msg[4:6]) < 1 {
		return "", 0, 0, false
	}
	var labels []string
	i := 12
	for i < len(msg) && msg[i] != 0 {
		n := int(msg[i])
		if n > 63 || i+1+n > len(msg) {
			return "", 0, 0, false
		}
		labels = append(labels, strings.ToLower(string(msg[i+1:i+1+n])))
		i += 1 + n
	}
	if i+5 > len(msg) {
		return "", 0, 0, false
	}
	return strings.Join(labels, "."), binary.BigEndian.Uint16(msg[i+1 : i+3]), i + 5, true
}

// answer: the reply to msg: its header and question, then an A record when ip is set.
func answer(msg []byte, end int, rcode byte, ip net.IP) []byte {
	reply := append([]byte{}, msg[:end]...)
	reply[2] = 0x84 | (msg[2] & 0x01) // response, authoritative, recursion desired copied
	reply[3] = 0x80 | rcode           // recursion available
	binary.BigEndian.PutUint16(reply[6:8], 0)
	binary.BigEndian.PutUint16(reply[8:10], 0)
	binary.BigEndian.PutUint16(reply[10:12], 0)
	if ip != nil {
		binary.BigEndian.PutUint16(reply[6:8], 1)
		reply = append(reply, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, ttl, 0, 4)
		reply = append(reply, ip...)
	}
	return reply
}

func (r *resolver) reply(msg []byte) []byte {
	name, qtype, end, ok := question(msg)
	if !ok {
		return nil
	}
	parts := strings.Split(strings.TrimSuffix(name, "."+r.domain), ".")
	if !strings.HasSuffix(name, "."+r.domain) || len(parts) < 3 || len(parts) > 4 || parts[len(parts)-1] != "svc" {
		return answer(msg, end, 3, nil) // NXDOMAIN: the resolver tries its next search domain
	}
	var ip net.IP
	var err error
	if len(parts) == 4 {
		ip, err = r.podIP(parts[0], parts[1], parts[2])
	} else {
		ip, err = r.clusterIP(parts[0], parts[1])
	}
	if err != nil {
		log.Printf("%s: %v", name, err)
		return answer(msg, end, 2, nil) // SERVFAIL
	}
	if ip == nil {
		return answer(msg, end, 3, nil)
	}
	if qtype != 1 { // AAAA and the rest: the name exists, with no record of that type
		return answer(msg, end, 0, nil)
	}
	return answer(msg, end, 0, ip)
}

func main() {
	listen := flag.String("listen", "", "UDP address to answer on")
	server := flag.String("server", "https://127.0.0.1:6443", "API server")
	ca := flag.String("ca", "", "API server CA")
	cert := flag.String("cert", "", "client certificate")
	key := flag.String("key", "", "client key")
	domain := flag.String("domain", "cluster.local", "cluster domain")
	flag.Parse()
	pem, err := os.ReadFile(*ca)
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	pair, err := tls.LoadX509KeyPair(*cert, *key)
	if err != nil {
		log.Fatal(err)
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}
	r := &resolver{client: &http.Client{Transport: transport, Timeout: 3 * time.Second}, server: *server, domain: *domain}
	conn, err := net.ListenPacket("udp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("gs-dns (stand-in for cluster DNS) on %s, *.svc.%s from %s", *listen, *domain, *server)
	buf := make([]byte, 512)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			log.Fatal(err)
		}
		msg := append([]byte{}, buf[:n]...)
		go func() {
			if reply := r.reply(msg); reply != nil {
				_, _ = conn.WriteTo(reply, from)
			}
		}()
	}
}
