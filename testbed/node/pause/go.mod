module gs-testbed/pause

go 1.26
