-- Named queries of the control plane's task operations (who may see or cancel a task).

-- name: task_scope
-- What decides who may see a task: its org and, for a DAG task, its DAG's owner and roles.
-- The status row (hash-partitioned by task_id) gives the start_day, as an init plan, so the
-- registry is pruned to the task's own month when the statement starts (a join on it instead
-- lets the planner probe every partition by task_id).
SELECT r.task_id, r.org_id, r.dag_id, d.org_id AS dag_org_id, d.owner_user_id, d.deploy_roles
FROM task_registry r
LEFT JOIN dags d ON d.dag_id = r.dag_id
WHERE r.task_id = %(task_id)s
  AND r.start_day = (SELECT s.start_day FROM task_status s WHERE s.task_id = %(task_id)s);

-- name: org_tasks
SELECT r.task_id, r.job, r.operator, r.dag_id, r.created_at,
       s.status, s.attempt, s.last_error, s.finished_at
FROM task_status s
JOIN task_registry r ON r.task_id = s.task_id AND r.start_day = s.start_day
WHERE r.org_id = %(org_id)s
ORDER BY r.created_at DESC
LIMIT %(limit)s;

-- name: foreign_datasets
-- Of these dataset uuids, the ones another org owns (an ad-hoc task may not name them).
SELECT dataset_uuid FROM datasets
WHERE dataset_uuid = ANY(%(uuids)s::uuid[]) AND org_id <> %(org_id)s
ORDER BY dataset_uuid;
