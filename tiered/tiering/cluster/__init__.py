"""Several brokers as one service: the pure decision of who leads what (cluster_decision), the coordinator that
reads the catalog, decides and applies (coordinator), and the plan a broker follows at start-up (startup)."""
