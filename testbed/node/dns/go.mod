module gs-testbed/dns

go 1.26
