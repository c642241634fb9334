"""The telecom domain's agent tools (13) and the task functions that set up or check the carrier's side.

Semantics are upstream's (``src/tau2/domains/telecom/tools.py``): the clock is fixed at
2025-02-25; lookups raise ``ValueError`` with upstream's text; ``refuel_data`` adds a charge
to the customer's draft bill, creating one when there is none. One deliberate difference:
that new bill's id is ``B`` plus 8 hex digits of a per-environment counter, where upstream
draws them from ``uuid4`` (random; the id is never graded: telecom's reward basis is
ENV_ASSERTION and ACTION, not DB).

``suspend_line_for_overdue_bill``, ``set_data_usage`` and the ``assert_*`` methods are not
tools: tasks call them from ``initialization_actions`` and ``env_assertions``.
"""

from __future__ import annotations

import datetime
from datetime import timedelta
from typing import Any

from .telecom_models import Bill, BillStatus, Customer, Device, Line, LineItem, LineStatus, Plan, TelecomDB
from .toolkit import GENERIC, READ, WRITE, Toolkit, tool

TODAY = datetime.date(2025, 2, 25)
CUSTOMER_ID = "ID of the customer who owns the line."
LINE_ID = "ID of the line."


class TelecomTools(Toolkit):
    db: TelecomDB

    def __init__(self, db: TelecomDB) -> None:
        super().__init__(db)
        self._new_bills = 0

    # -- lookups (helpers raise, as upstream) -------------------------------------------

    def _line_by_phone(self, phone_number: str) -> Line:
        for line in self.db.lines:
            if line.phone_number == phone_number:
                return line
        raise ValueError(f"Line with phone number {phone_number} not found")

    def _line(self, line_id: str) -> Line:
        for line in self.db.lines:
            if line.line_id == line_id:
                return line
        raise ValueError(f"Line with ID {line_id} not found")

    def _plan(self, plan_id: str) -> Plan:
        for plan in self.db.plans:
            if plan.plan_id == plan_id:
                return plan
        raise ValueError(f"Plan with ID {plan_id} not found")

    def _device(self, device_id: str) -> Device:
        for device in self.db.devices:
            if device.device_id == device_id:
                return device
        raise ValueError(f"Device with ID {device_id} not found")

    def _bill(self, bill_id: str) -> Bill:
        for bill in self.db.bills:
            if bill.bill_id == bill_id:
                return bill
        raise ValueError(f"Bill with ID {bill_id} not found")

    def _target_line(self, customer_id: str, line_id: str) -> Line:
        customer = self.get_customer_by_id(customer_id)
        if line_id not in customer.line_ids:
            raise ValueError(f"Line {line_id} not found for customer {customer_id}")
        return self._line(line_id)

    def bills_awaiting_payment(self, customer: Customer) -> list[Bill]:
        bills = (self._bill(bill_id) for bill_id in customer.bill_ids)
        return [bill for bill in bills if bill.status == BillStatus.AWAITING_PAYMENT]

    def set_bill_to_paid(self, bill_id: str) -> None:
        self._bill(bill_id).status = BillStatus.PAID

    # -- tools ---------------------------------------------------------------------------

    @tool(
        READ,
        "Finds a customer by their primary contact or line phone number.",
        {"phone_number": "The phone number to search for."},
    )
    def get_customer_by_phone(self, phone_number: str) -> Customer:
        for customer in self.db.customers:
            if customer.phone_number == phone_number:
                return customer
            for line_id in customer.line_ids:
                if self._line(line_id).phone_number == phone_number:
                    return customer
        raise ValueError(f"Customer with phone number {phone_number} not found")

    @tool(
        READ,
        "Retrieves a customer directly by their unique ID.",
        {"customer_id": "The unique identifier of the customer."},
    )
    def get_customer_by_id(self, customer_id: str) -> Customer:
        for customer in self.db.customers:
            if customer.customer_id == customer_id:
                return customer
        raise ValueError(f"Customer with ID {customer_id} not found")

    @tool(
        READ,
        "Searches for customers by name and DOB. May return multiple matches if names are similar, "
        "DOB helps disambiguate.",
        {
            "full_name": "The full name of the customer.",
            "dob": "Date of birth for verification, in the format YYYY-MM-DD.",
        },
    )
    def get_customer_by_name(self, full_name: str, dob: str) -> list[Customer]:
        return [c for c in self.db.customers if c.full_name.lower() == full_name.lower() and c.date_of_birth == dob]

    @tool(
        READ,
        "Retrieves the details for a given ID. The ID must be a valid ID for a Customer, Line, Device, Bill, or Plan.",
        {"id": "The ID of the object to retrieve."},
    )
    def get_details_by_id(self, id: str) -> Any:  # noqa: A002 - upstream's argument name
        lookups = {"L": self._line, "D": self._device, "B": self._bill, "C": self.get_customer_by_id, "P": self._plan}
        if id[:1] not in lookups:
            raise ValueError(f"Unknown ID format or type: {id}")
        return lookups[id[:1]](id)

    @tool(
        WRITE,
        "Suspends a specific line (max 6 months). Checks: Line status must be Active. Logic: Sets line status "
        "to Suspended, records suspension_start_date.",
        {"customer_id": CUSTOMER_ID, "line_id": "ID of the line to suspend.", "reason": "Reason for suspension."},
    )
    def suspend_line(self, customer_id: str, line_id: str, reason: str) -> dict[str, Any]:
        line = self._target_line(customer_id, line_id)
        if line.status != LineStatus.ACTIVE:
            raise ValueError("Line must be active to suspend")
        line.status = LineStatus.SUSPENDED
        line.suspension_start_date = TODAY
        return {"message": "Line suspended successfully. $5/month holding fee will apply.", "line": line}

    @tool(
        WRITE,
        "Resumes a suspended line. Checks: Line status must be Suspended or Pending Activation. Logic: Sets line "
        "status to Active, clears suspension_start_date.",
        {"customer_id": CUSTOMER_ID, "line_id": "ID of the line to resume."},
    )
    def resume_line(self, customer_id: str, line_id: str) -> dict[str, Any]:
        line = self._target_line(customer_id, line_id)
        if line.status not in (LineStatus.SUSPENDED, LineStatus.PENDING_ACTIVATION):
            raise ValueError("Line must be suspended to resume")
        line.status = LineStatus.ACTIVE
        line.suspension_start_date = None
        return {"message": "Line resumed successfully", "line": line}

    @tool(
        READ,
        "Retrieves a list of the customer's bills, most recent first.",
        {"customer_id": "ID of the customer.", "limit": "Maximum number of bills to return (default 12)."},
    )
    def get_bills_for_customer(self, customer_id: str, limit: int = 12) -> list[Bill]:
        customer = self.get_customer_by_id(customer_id)
        bills = sorted((self._bill(b) for b in customer.bill_ids), key=lambda bill: bill.issue_date, reverse=True)
        return bills[:limit]

    @tool(
        WRITE,
        "Sends a payment request to the customer for a specific bill. Checks: Customer exists; Bill exists and "
        "belongs to the customer; No other bills are already awaiting payment for this customer. Logic: Sets "
        "bill status to AWAITING_PAYMENT and notifies customer. Warning: This method does not check if the bill "
        "is already PAID. Always check the bill status before calling this method.",
        {
            "customer_id": "ID of the customer who owns the bill.",
            "bill_id": "ID of the bill to send payment request for.",
        },
    )
    def send_payment_request(self, customer_id: str, bill_id: str) -> str:
        customer = self.get_customer_by_id(customer_id)
        if self.bills_awaiting_payment(customer):
            raise ValueError("A bill is already awaiting payment for this customer")
        if bill_id not in customer.bill_ids:
            raise ValueError(f"Bill {bill_id} not found for customer {customer_id}")
        bill = self._bill(bill_id)
        bill.status = BillStatus.AWAITING_PAYMENT
        return f"Payment request sent to the customer for bill {bill.bill_id}"

    def _charge(self, customer_id: str, amount: float, description: str) -> None:
        """Upstream's ``_apply_one_time_charge``: a line item on the draft bill (made when missing)."""
        customer = self.get_customer_by_id(customer_id)
        draft = next(
            (b for b in (self._bill(i) for i in customer.bill_ids) if b.status == BillStatus.DRAFT),
            None,
        )
        if draft is None:
            start = (TODAY.replace(day=1) + timedelta(days=32)).replace(day=1)
            following = start.replace(
                month=start.month + 1 if start.month < 12 else 1,
                year=start.year if start.month < 12 else start.year + 1,
            )
            self._new_bills += 1
            draft = Bill(
                bill_id=f"B{self._new_bills:08x}",
                customer_id=customer_id,
                period_start=start,
                period_end=following - timedelta(days=1),
                issue_date=start,
                total_due=0,
                due_date=start + timedelta(days=14),
                status=BillStatus.DRAFT,
            )
            self.db.bills.append(draft)
            customer.bill_ids.append(draft.bill_id)
        draft.line_items.append(
            LineItem(description=description, amount=amount, date=TODAY, item_type="Credit" if amount < 0 else "Charge")
        )
        draft.total_due += amount

    @tool(
        READ,
        "Retrieves current billing cycle data usage for a line, including data refueling amount, data limit, "
        "and cycle end date.",
        {"customer_id": CUSTOMER_ID, "line_id": "ID of the line to check usage for."},
    )
    def get_data_usage(self, customer_id: str, line_id: str) -> dict[str, Any]:
        line = self._target_line(customer_id, line_id)
        plan = self._plan(line.plan_id)
        cycle_end = datetime.date(TODAY.year, TODAY.month + 1 if TODAY.month < 12 else 1, 1) - timedelta(days=1)
        return {
            "line_id": line_id,
            "data_used_gb": line.data_used_gb,
            "data_limit_gb": plan.data_limit_gb,
            "data_refueling_gb": line.data_refueling_gb,
            "cycle_end_date": cycle_end,
        }

    @tool(
        WRITE,
        "Enables international roaming on a line.",
        {"customer_id": CUSTOMER_ID, "line_id": "ID of the line to enable roaming for."},
    )
    def enable_roaming(self, customer_id: str, line_id: str) -> str:
        line = self._target_line(customer_id, line_id)
        if line.roaming_enabled:
            return "Roaming was already enabled"
        line.roaming_enabled = True
        return "Roaming enabled successfully"

    @tool(
        WRITE,
        "Disables international roaming on a line.",
        {"customer_id": CUSTOMER_ID, "line_id": "ID of the line to disable roaming for."},
    )
    def disable_roaming(self, customer_id: str, line_id: str) -> str:
        line = self._target_line(customer_id, line_id)
        if not line.roaming_enabled:
            return "Roaming was already disabled"
        line.roaming_enabled = False
        return "Roaming disabled successfully"

    @tool(
        GENERIC,
        "Transfer the user to a human agent, with a summary of the user's issue. Only transfer if the user "
        "explicitly asks for a human agent, or if given the policy and the available tools, you cannot solve "
        "the user's issue.",
        {"summary": "A summary of the user's issue."},
    )
    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"

    @tool(
        WRITE,
        "Refuels data for a specific line, adding to the customer's bill. Checks: Line status must be Active, "
        "Customer owns the line. Logic: Adds data to the line and charges customer based on the plan's "
        "refueling rate.",
        {
            "customer_id": CUSTOMER_ID,
            "line_id": "ID of the line to refuel data for.",
            "gb_amount": "Amount of data to add in gigabytes.",
        },
    )
    def refuel_data(self, customer_id: str, line_id: str, gb_amount: float) -> dict[str, Any]:
        line = self._target_line(customer_id, line_id)
        if gb_amount <= 0:
            raise ValueError("Refuel amount must be positive")
        plan = self._plan(line.plan_id)
        charge = gb_amount * plan.data_refueling_price_per_gb
        line.data_refueling_gb += gb_amount
        self._charge(customer_id, charge, f"Data refueling: {gb_amount} GB at ${plan.data_refueling_price_per_gb}/GB")
        return {
            "message": f"Successfully added {gb_amount} GB of data for line {line_id} for ${charge:.2f}",
            "new_data_refueling_gb": line.data_refueling_gb,
            "charge": charge,
        }

    # -- task set-up and assertions (not tools) ---------------------------------------------

    def set_data_usage(self, customer_id: str, line_id: str, data_used_gb: float) -> str:
        self._target_line(customer_id, line_id).data_used_gb = data_used_gb
        return f"Data usage set to {data_used_gb} GB for line {line_id}"

    def suspend_line_for_overdue_bill(
        self, customer_id: str, line_id: str, new_bill_id: str, contract_ended: bool
    ) -> str:
        line = self._line(line_id)
        if line.status != LineStatus.ACTIVE:
            raise ValueError("Line must be active to suspend for unpaid bill")
        amount = self._plan(line.plan_id).price_per_month
        if amount <= 0:
            raise ValueError("Amount must be positive for overdue bill")
        customer = self.get_customer_by_id(customer_id)
        if any(self._bill(b).status == BillStatus.OVERDUE for b in customer.bill_ids):
            raise ValueError("Customer already has an overdue bill")
        last_month_end = TODAY.replace(day=1) - timedelta(days=1)
        last_month_start = last_month_end.replace(day=1)
        bill = Bill(
            bill_id=new_bill_id,
            customer_id=customer_id,
            period_start=last_month_start,
            period_end=last_month_end,
            issue_date=last_month_start,
            total_due=0,
            due_date=last_month_start + timedelta(days=14),
            status=BillStatus.OVERDUE,
        )
        bill.line_items.append(
            LineItem(description=f"Charge for line {line.line_id}", amount=amount, date=TODAY, item_type="Charge")
        )
        bill.total_due += amount
        self.db.bills.append(bill)
        customer.bill_ids.append(new_bill_id)
        line.status = LineStatus.SUSPENDED
        line.suspension_start_date = TODAY
        if contract_ended:
            line.contract_end_date = last_month_end
        return f"Line {line_id} suspended for unpaid bill {new_bill_id}. Contract ended: {contract_ended}"

    def assert_data_refueling_amount(self, customer_id: str, line_id: str, expected_amount: float) -> bool:
        return abs(self._target_line(customer_id, line_id).data_refueling_gb - expected_amount) < 1e-6

    def assert_line_status(self, customer_id: str, line_id: str, expected_status: str) -> bool:
        return self._target_line(customer_id, line_id).status == expected_status

    def assert_overdue_bill_exists(self, customer_id: str, overdue_bill_id: str) -> bool:
        customer = self.get_customer_by_id(customer_id)
        if overdue_bill_id not in customer.bill_ids:
            raise ValueError(f"Overdue bill {overdue_bill_id} not found")
        if self._bill(overdue_bill_id).status != BillStatus.OVERDUE:
            raise ValueError(f"Overdue bill {overdue_bill_id} is not overdue")
        return True

    def assert_no_overdue_bill(self, overdue_bill_id: str) -> bool:
        try:
            return self._bill(overdue_bill_id).status == BillStatus.PAID
        except ValueError:
            return True
