"""testgen: requests for generated API test suites, and the agents that write them."""
