// om-parser reads an OpenMetrics exposition on stdin with Prometheus's own
// parser (github.com/prometheus/prometheus/model/textparse, what a
// Prometheus server scraping application/openmetrics-text uses) and prints
// the number of series, or the parser's error with exit status 1. The
// exporter's and the operator's tests feed it their /metrics output.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
)

func main() {
	body, err := io.ReadAll(io.LimitReader(os.Stdin, 64<<20))
	if err != nil {
		fmt.Fprintln(os.Stderr, "reading stdin:", err)
		os.Exit(2)
	}
	p := textparse.NewOpenMetricsParser(body, labels.NewSymbolTable())
	series := 0
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		if entry == textparse.EntrySeries {
			series++
		}
	}
	fmt.Println("series:", series)
}
