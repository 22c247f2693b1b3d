"""Code generators: each turns optimized IR into something that runs."""
