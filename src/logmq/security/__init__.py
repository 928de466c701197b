"""Authentication and authorization: SASL mechanisms, TLS, ACLs (sans-IO cores)."""
