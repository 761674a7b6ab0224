"""The AWS profile's adapters: the Lambda handlers a user deploys (`lambda_handler` for tasks,
`eventbridge` and `apigateway` for triggers: docs/aws-entry.md) and the Lambda invokers. An
entry handler parses its event and calls the same code as Lite's scheduler or Gateway."""
