-- The e2e application's own tables, which exist before the flows' migrations are applied (as an
-- application's migrations run before its flows'): the `db` fixture of tests/e2e creates them.
-- e2eOrdered starts a run when an order is placed (its table trigger, engine 0032).
create table if not exists public.e2e_orders (
  id int generated always as identity primary key,
  customer text not null,
  status text not null default 'draft'
);
