"""Developer tools: proto generation, CDI checker, benchmarks, playground."""
