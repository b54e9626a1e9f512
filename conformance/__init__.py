"""The witness suite: launch real tasks through the sandbox under test and assert from inside them."""
