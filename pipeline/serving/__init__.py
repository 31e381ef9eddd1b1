"""The embedded policy server: SGLang's HTTP protocol over transformers on CPU."""
