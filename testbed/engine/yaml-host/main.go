// The YAML language host of pulumi-yaml (YAML_HOST_VERSION in versions.env, the newest the Go module proxy serves
// here), started as its own command starts it but fitted to the pinned CLI in two ways. The host's own code is
// pulumi-yaml's, unchanged.
//
//  1. The engine's schema loader, which the CLI hands every program it runs. With its own loader the host starts a
//     component package's language host itself, through the Pulumi SDK it was built with (v3.206.0), which passes a
//     flag (`-toolchain`) the pinned Python host no longer takes: a YAML program could not load the gpu-serving
//     package's schema. Through the engine's loader the CLI starts the package, as it does for `pulumi package add`.
//  2. Link, which v1.25.0 lacks and the CLI calls at the end of `pulumi package add` (and `pulumi install`) before it
//     records the package in Pulumi.yaml. A YAML program has nothing to link: it reads each package's schema when
//     it runs. Without it both commands fail with "method Link not implemented".
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/pulumi/pulumi-yaml/pkg/server"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/cmdutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/logging"
	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/grpc"
)

func main() {
	tracing := flag.String("tracing", "", "Zipkin-compatible endpoint to send traces to")
	flag.String("root", "", "root of the program's execution (not used)")
	flag.String("compiler", "", "obsolete, not used")
	flag.Parse()
	logging.InitLogging(false, 0, false)
	cmdutil.InitTracing("pulumi-language-yaml", "pulumi-language-yaml", *tracing)

	var engine string
	var stop chan bool
	if flag.NArg() > 0 {
		engine = flag.Arg(0)
		stop = whileEngineAnswers(engine)
	}
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Cancel: stop,
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, linking{server.NewLanguageHost(engine, *tracing, true /* the engine's loader */)})
			return nil
		},
	})
	if err != nil {
		cmdutil.Exit(fmt.Errorf("could not serve the language host: %w", err))
	}
	// The engine reads the port from the first line.
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		cmdutil.Exit(fmt.Errorf("the language host stopped: %w", err))
	}
}

// linking is pulumi-yaml's host with a Link that links nothing (2. above).
type linking struct {
	pulumirpc.LanguageRuntimeServer
}

func (linking) Link(context.Context, *pulumirpc.LinkRequest) (*pulumirpc.LinkResponse, error) {
	return &pulumirpc.LinkResponse{}, nil
}

// whileEngineAnswers returns a channel closed once the engine stops answering health checks, or on SIGINT.
func whileEngineAnswers(address string) chan bool {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	stopped := make(chan bool)
	go func() {
		<-ctx.Done()
		cancel()
		close(stopped)
	}()
	if err := rpcutil.Healthcheck(ctx, address, 5*time.Minute, cancel); err != nil {
		cmdutil.Exit(fmt.Errorf("could not check the engine's health: %w", err))
	}
	return stopped
}
